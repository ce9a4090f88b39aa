//go:build !cgo || !linux || nordma

package rdma

import (
	"context"
	"errors"
	"testing"

	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
)

func TestNoRDMABuild(t *testing.T) {
	d, err := transport.Lookup("iser")
	if err != nil {
		t.Fatalf("iser scheme not registered in a build without RDMA: %v", err)
	}
	_, err = d.Dial(context.Background(), "192.0.2.1:3260", transport.DialOptions{})
	if !errors.Is(err, ErrNoRDMA) || err.Error() == "" {
		t.Fatalf("dial: %v, want ErrNoRDMA", err)
	}
}
