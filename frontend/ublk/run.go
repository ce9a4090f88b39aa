package ublk

import (
	"context"
	"fmt"

	"github.com/iser-blk/iser-blk/block"
)

// Run is the whole life of an attached device, as `iser-blk attach --ublk` runs it: Start,
// announce the block device path, serve until ctx is cancelled (SIGINT/SIGTERM) or the server
// fails, then Shutdown (stop, drain, flush, delete). It returns nil after a clean shutdown on
// cancellation; otherwise the first error. It does not close dev.
func Run(ctx context.Context, dev block.Device, opts Options, announce func(path string)) error {
	s, err := Start(ctx, dev, opts)
	if err != nil {
		return err
	}
	if announce != nil {
		announce(s.BlockPath())
	}
	var failed error
	select {
	case <-ctx.Done():
	case <-s.Failed():
		failed = s.Err()
	}
	// The shutdown flush must not be cut short by the signal that started it.
	err = s.Shutdown(context.WithoutCancel(ctx))
	if failed != nil {
		if err != nil {
			return fmt.Errorf("%w (and shutting down: %v)", failed, err)
		}
		return failed
	}
	return err
}
