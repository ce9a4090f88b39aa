package main

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/frontend/ublk"
	"github.com/iser-blk/iser-blk/internal/statefile"
)

// runUblk is ublk.Run with the takeover of attach --name: the device is created recoverable and
// its state recorded before it takes a request; a device a dead predecessor left is taken over
// (fenced when its state says so); the state file goes once the device is deleted.
func runUblk(ctx context.Context, dev block.Device, uopts ublk.Options, t *takeover, announce func(string)) error {
	if t == nil {
		return ublk.Run(ctx, dev, uopts, announce)
	}
	// Reissue is safe for cache off and write-through (see frontend/ublk/recovery.go); a
	// write-back cache that dies may have lost acknowledged writes, so its I/O should fail at
	// once where the kernel can (FAIL_IO), and its successor fences the device anyway.
	uopts.Recovery = ublk.RecoveryReissue
	if t.cacheMode == statefile.CacheWriteBack {
		uopts.Recovery = ublk.RecoveryFailIO
	}
	uopts.OnCreated = func(id uint32) error {
		t.setCanWait(func() error { return ublkCanWait(id) })
		return t.record(statefile.KindUblk, int(id))
	}
	if t.prev != nil {
		id := uint32(t.prev.DevID)
		t.log.Info("taking over the ublk device a previous gateway left", zap.String("dev", fmt.Sprintf("/dev/ublkb%d", id)),
			zap.Int("previous_pid", t.prev.PID), zap.String("cache", t.prev.CacheMode), zap.Bool("dirty", t.prev.Dirty))
		err := ublk.RunRecover(ctx, t.serving(dev), id, uopts, announce)
		switch {
		case errors.Is(err, ublk.ErrNoDevice):
			t.log.Warn("the device the state file names is gone; creating a new one", zap.Error(err))
			if ok, why := t.prev.Resumable(); !ok {
				t.log.Error("the previous gateway may have lost acknowledged writes: check the filesystem (fsck) before mounting", zap.String("why", why))
			}
			t.prev = nil
		case errors.Is(err, ublk.ErrNotWaiting), errors.Is(err, ublk.ErrMismatch):
			return fmt.Errorf("%w: %w", errNoResume, err)
		default:
			return forgetAfter(t, err)
		}
	}
	return forgetAfter(t, ublk.Run(ctx, t.serving(dev), uopts, announce))
}

// ublkCanWait refuses a planned restart of a ublk device the kernel would not hand over
// intact: without UBLK_F_USER_RECOVERY_REISSUE the driver fails the requests the old image
// holds (ublk_drv's __ublk_fail_req when ublk_nosrv_should_reissue_outstanding is false), with
// UBLK_F_USER_RECOVERY_FAIL_IO it fails all of them until the successor is up.
func ublkCanWait(id uint32) error {
	ok, err := ublk.DeviceReissues(id)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("/dev/ublkb%d was created without UBLK_F_USER_RECOVERY_REISSUE (the kernel lacks it, or fails I/O while no server runs, as for a write-back cache on kernels with UBLK_F_USER_RECOVERY_FAIL_IO): the requests in flight would fail with EIO", id)
	}
	return nil
}

// forgetAfter removes the state file when the device was detached cleanly (it no longer exists).
func forgetAfter(t *takeover, err error) error {
	if err == nil {
		t.forget()
	}
	return err
}
