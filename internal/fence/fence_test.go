package fence

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/block"
)

// The fence's contract is the opposite of blocktest's I/O checks (every request fails), so it
// is checked here op by op; geometry and Close are the device's.
func TestEveryIOFailsAndNothingReachesTheDevice(t *testing.T) {
	dev, err := memdev.New(1<<20, memdev.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	want := make([]byte, 4096)
	for i := range want {
		want[i] = 0xa5
	}
	if err := dev.WriteAt(ctx, want, 0, 0); err != nil {
		t.Fatal(err)
	}
	f := New(dev, "gateway (pid 7) died dirty")
	buf := make([]byte, 4096)
	ops := map[string]error{
		"read":         f.ReadAt(ctx, buf, 0),
		"write":        f.WriteAt(ctx, buf, 0, block.FUA),
		"flush":        f.Flush(ctx),
		"discard":      f.Discard(ctx, 0, 4096),
		"write-zeroes": f.WriteZeroes(ctx, 0, 4096, 0),
	}
	for op, err := range ops {
		if !errors.Is(err, block.ErrIO) || !strings.Contains(err.Error(), "pid 7") {
			t.Errorf("%s: %v, want ErrIO saying why", op, err)
		}
	}
	if err := dev.ReadAt(ctx, buf, 0); err != nil || string(buf) != string(want) {
		t.Fatalf("the device below changed under the fence (%v)", err)
	}
	if f.Size() != dev.Size() || f.BlockSize() != dev.BlockSize() {
		t.Fatal("the fence changed the device's geometry")
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dev.ReadAt(ctx, buf, 0); !errors.Is(err, block.ErrClosed) {
		t.Fatalf("Close did not reach the device: %v", err)
	}
}
