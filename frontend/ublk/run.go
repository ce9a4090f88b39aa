package ublk

import (
	"context"
	"fmt"

	"github.com/iser-blk/iser-blk/block"
)

// Run is the whole life of an attached device, as `iser-blk attach --ublk` runs it: Start,
// announce the block device path, serve until ctx is cancelled (SIGINT/SIGTERM) or the server
// fails, then Detach (STOP_DEV drains the requests in flight, then the device is deleted). It
// returns nil after a clean detach on cancellation; otherwise the first error.
//
// Run neither flushes nor closes dev: when it returns, no request can reach dev any more, and the
// caller makes the acknowledged writes durable with its final flush (the CLI's closeDevice, which
// reports progress and lets a second signal abort it, exactly as after an NBD detach).
func Run(ctx context.Context, dev block.Device, opts Options, announce func(path string)) error {
	s, err := Start(ctx, dev, opts)
	if err != nil {
		return err
	}
	return serveUntilDone(ctx, s, announce)
}

// attached is what Run needs of a started Server (a fake in the tests).
type attached interface {
	BlockPath() string
	Failed() <-chan struct{}
	Err() error
	Detach() error
}

// serveUntilDone announces s, waits for cancellation or failure, and detaches.
func serveUntilDone(ctx context.Context, s attached, announce func(path string)) error {
	if announce != nil {
		announce(s.BlockPath())
	}
	var failed error
	select {
	case <-ctx.Done():
	case <-s.Failed():
		failed = s.Err()
	}
	err := s.Detach()
	if failed != nil {
		if err != nil {
			return fmt.Errorf("%w (and shutting down: %v)", failed, err)
		}
		return failed
	}
	return err
}
