// Package fence is the device a gateway serves in place of a LUN whose acknowledged writes may
// have been lost: every request fails with an I/O error (EIO to the kernel) that says why. A
// successor serves it when its predecessor died with a write-back cache that could hold
// acknowledged writes (internal/statefile's rule): failing at once is loud and safe, where
// resuming would let the filesystem believe lost writes durable, and leaving the device without
// a server would hang every process that touches it.
//
// Invariants: no read, write, flush, discard or write-zeroes reaches the device below; geometry,
// limits and Close are the device's, so the kernel device keeps its shape and the session is
// logged out at the end.
package fence

import (
	"context"
	"fmt"

	"github.com/iser-blk/iser-blk/block"
)

// Device fails every I/O with Err.
type Device struct {
	block.Device // geometry and Close; never I/O
	// Err wraps block.ErrIO and says why the device is fenced.
	Err error
}

// New fences dev for the reason why.
func New(dev block.Device, why string) *Device {
	return &Device{Device: dev, Err: fmt.Errorf("%w: device fenced: %s", block.ErrIO, why)}
}

func (f *Device) ReadAt(context.Context, []byte, int64) error                      { return f.Err }
func (f *Device) WriteAt(context.Context, []byte, int64, block.WriteFlags) error   { return f.Err }
func (f *Device) Flush(context.Context) error                                      { return f.Err }
func (f *Device) Discard(context.Context, int64, int64) error                      { return f.Err }
func (f *Device) WriteZeroes(context.Context, int64, int64, block.ZeroFlags) error { return f.Err }
