//go:build cgo && linux && !nordma && !vm

package rdma

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
)

// On the host tier (no RDMA device; or, on a machine with one, no iSER listener on loopback) every
// dial fails cleanly, with a message that names the missing piece, and leaves nothing allocated.
func TestDialWithoutDevice(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before := Stats()
	_, err := Dial(ctx, "127.0.0.1", 3260, Config{})
	if err == nil {
		t.Fatal("dial succeeded without an RDMA device")
	}
	t.Logf("dial: %v", err)
	if errors.Is(err, syscall.ENODEV) && !errors.Is(err, ErrNoDevice) {
		t.Fatalf("a dial failing with ENODEV does not say ErrNoDevice: %v", err)
	}
	d, err := transport.Lookup("iser")
	if err != nil {
		t.Fatalf("iser transport not registered: %v", err)
	}
	if _, err := d.Dial(ctx, "127.0.0.1:3260", transport.DialOptions{}); err == nil {
		t.Fatal("iser dial succeeded without an RDMA device")
	}
	if after := Stats(); after != before {
		t.Fatalf("failed dials leaked: before %+v after %+v", before, after)
	}
}
