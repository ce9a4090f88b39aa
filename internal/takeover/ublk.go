package takeover

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/frontend/ublk"
	"github.com/iser-blk/iser-blk/internal/modes"
)

// UblkKernel is the kernel calls of RunUblk: frontend/ublk's in production.
type UblkKernel struct {
	Run            func(ctx context.Context, dev block.Device, opts ublk.Options, announce func(string)) error
	RunRecover     func(ctx context.Context, dev block.Device, id uint32, opts ublk.Options, announce func(string)) error
	DeviceReissues func(id uint32) (bool, error)
}

// KernelUblk is the real kernel.
var KernelUblk = UblkKernel{Run: ublk.Run, RunRecover: ublk.RunRecover, DeviceReissues: ublk.DeviceReissues}

// RunUblk is ublk.Run with the takeover: the device is created recoverable and its state
// recorded before it takes a request; a device a dead predecessor left is taken over (fenced
// when its state says so); the state file goes once the device is deleted.
func (t *Takeover) RunUblk(ctx context.Context, k UblkKernel, dev block.Device, uopts ublk.Options, announce func(string)) error {
	// Reissue for every cache mode: requests in flight when a gateway dies were not answered, so
	// handing them to the successor loses nothing; a successor that finds the state dirty fences
	// the device and fails them then. FAIL_IO (fail at once) would also fail the requests of a
	// write-back gateway that died clean, and refuse its planned restart (ublkCanWait).
	uopts.Recovery = ublk.RecoveryReissue
	uopts.OnCreated = func(id uint32) error {
		t.SetCanWait(func() error { return ublkCanWait(k, id) })
		return t.Record(modes.Ublk, int(id))
	}
	if prev := t.Previous(); prev != nil {
		id := uint32(prev.DevID)
		if uopts.ID != nil && *uopts.ID != id {
			// Taking over the device the state names is what the name promises its mounts; a
			// new device with the asked number would leave that one waiting for ever.
			return fmt.Errorf("%w: %s names /dev/ublkb%d, which a previous gateway left waiting, but this attach asks for /dev/ublkb%d: attach with the number it has to take it over, or delete that device and the state file first",
				ErrNoResume, t.path, id, *uopts.ID)
		}
		t.log.Info("taking over the ublk device a previous gateway left", zap.String("dev", fmt.Sprintf("/dev/ublkb%d", id)),
			zap.Int("previous_pid", prev.PID), zap.Stringer("cache", prev.CacheMode), zap.Bool("dirty", prev.Dirty))
		err := k.RunRecover(ctx, t.Serving(dev), id, uopts, announce)
		switch {
		case errors.Is(err, ublk.ErrNoDevice):
			t.log.Warn("the device the state file names is gone; creating a new one", zap.Error(err))
			if ok, why := prev.Resumable(); !ok {
				t.log.Error("the previous gateway may have lost acknowledged writes: check the filesystem (fsck) before mounting", zap.String("why", why))
			}
			t.dropPrevious()
		case errors.Is(err, ublk.ErrNotWaiting), errors.Is(err, ublk.ErrMismatch):
			return fmt.Errorf("%w: %w", ErrNoResume, err)
		default:
			return t.forgetAfter(err)
		}
	}
	return t.forgetAfter(k.Run(ctx, t.Serving(dev), uopts, announce))
}

// ublkCanWait refuses a hand-over of a ublk device the kernel would not hand over intact:
// without UBLK_F_USER_RECOVERY_REISSUE the driver fails the requests the old image holds
// (ublk_drv's __ublk_fail_req when ublk_nosrv_should_reissue_outstanding is false), with
// UBLK_F_USER_RECOVERY_FAIL_IO it fails all of them until the successor is up.
func ublkCanWait(k UblkKernel, id uint32) error {
	ok, err := k.DeviceReissues(id)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("/dev/ublkb%d was created without UBLK_F_USER_RECOVERY_REISSUE (the kernel lacks it, or fails I/O while no server runs, as for a write-back cache on kernels with UBLK_F_USER_RECOVERY_FAIL_IO): the requests in flight would fail with EIO", id)
	}
	return nil
}

// forgetAfter removes the state file when the device was deleted cleanly (err nil). A device
// kept for a successor is never deleted: the process exits (or re-executes) without returning
// here, and the file stays.
func (t *Takeover) forgetAfter(err error) error {
	if err == nil {
		t.Forget()
	}
	return err
}
