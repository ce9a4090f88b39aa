package takeover

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/frontend/ublk"
	"github.com/iser-blk/iser-blk/internal/modes"
)

// fakeUblk records which kernel call RunUblk made and with which device number.
type fakeUblk struct{ calls []string }

func (f *fakeUblk) kernel() UblkKernel {
	return UblkKernel{
		Run: func(_ context.Context, _ block.Device, o ublk.Options, _ func(string)) error {
			if o.ID == nil {
				f.calls = append(f.calls, "run any")
			} else {
				f.calls = append(f.calls, fmt.Sprint("run ", *o.ID))
			}
			return nil
		},
		RunRecover: func(_ context.Context, _ block.Device, id uint32, _ ublk.Options, _ func(string)) error {
			f.calls = append(f.calls, fmt.Sprint("recover ", id))
			return nil
		},
		DeviceReissues: func(uint32) (bool, error) { return true, nil },
	}
}

// TestRunUblkWithAnIDTakesOverOnlyThatDevice: a fixed device number (attach --ublk-id) that is
// the one the predecessor left takes it over; another number is refused before any kernel
// call, since the device the name's mounts are on would otherwise wait for ever.
func TestRunUblkWithAnIDTakesOverOnlyThatDevice(t *testing.T) {
	dev := memDevice(t, 1<<20)
	for _, tt := range []struct {
		id    uint32
		calls []string
		err   error
	}{
		{5, []string{"recover 5"}, nil},
		{6, nil, ErrNoResume},
	} {
		dir := t.TempDir()
		if err := mustPrepare(t, dir, "gw", modes.Ublk, modes.WriteThrough, dev).Record(modes.Ublk, 5); err != nil {
			t.Fatal(err)
		}
		tk := mustPrepare(t, dir, "gw", modes.Ublk, modes.WriteThrough, dev)
		var f fakeUblk
		id := tt.id
		err := tk.RunUblk(context.Background(), f.kernel(), dev, ublk.Options{ID: &id}, func(string) {})
		if !errors.Is(err, tt.err) || len(f.calls) != len(tt.calls) || (len(tt.calls) > 0 && f.calls[0] != tt.calls[0]) {
			t.Errorf("--ublk-id %d over a predecessor's ublkb5: err %v, calls %q; want %v, %q", tt.id, err, f.calls, tt.err, tt.calls)
		}
	}
	// Without a predecessor the number goes to ADD_DEV.
	var f fakeUblk
	id := uint32(7)
	if err := mustPrepare(t, t.TempDir(), "gw", modes.Ublk, modes.Off, dev).RunUblk(context.Background(), f.kernel(), dev, ublk.Options{ID: &id}, func(string) {}); err != nil || len(f.calls) != 1 || f.calls[0] != "run 7" {
		t.Fatalf("fresh --ublk-id 7: err %v, calls %q; want run 7", err, f.calls)
	}
}
