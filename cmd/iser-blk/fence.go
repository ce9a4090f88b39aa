package main

import (
	"context"
	"fmt"

	"github.com/iser-blk/iser-blk/block"
)

// fencedDevice answers every request with an I/O error (EIO to the kernel) and says why. A
// successor gateway serves it in place of the LUN when its predecessor died with a write-back
// cache that could hold acknowledged writes (internal/statefile's rule): failing at once is loud
// and safe, where resuming would let the filesystem believe lost writes durable, and leaving the
// device without a server would hang every process that touches it.
type fencedDevice struct {
	block.Device // geometry and Close; never I/O
	err          error
}

func fence(dev block.Device, why string) block.Device {
	return &fencedDevice{Device: dev, err: fmt.Errorf("%w: device fenced: %s", block.ErrIO, why)}
}

func (f *fencedDevice) ReadAt(context.Context, []byte, int64) error { return f.err }
func (f *fencedDevice) WriteAt(context.Context, []byte, int64, block.WriteFlags) error {
	return f.err
}
func (f *fencedDevice) Flush(context.Context) error                 { return f.err }
func (f *fencedDevice) Discard(context.Context, int64, int64) error { return f.err }
func (f *fencedDevice) WriteZeroes(context.Context, int64, int64, block.ZeroFlags) error {
	return f.err
}
