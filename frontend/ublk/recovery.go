package ublk

// Recovery: a device that outlives its server (UBLK_F_USER_RECOVERY, include/uapi/linux/ublk_cmd.h).
//
// When the server of a recoverable device dies, the driver quiesces the disk (UBLK_S_DEV_QUIESCED):
// /dev/ublkbN stays, a mounted filesystem stays, and I/O waits in the kernel. With
// UBLK_F_USER_RECOVERY_REISSUE the requests the dead server had taken are requeued too, rather
// than failed. A new server then takes the device over: START_USER_RECOVERY (accepted once the
// old /dev/ublkcN is closed), a FETCH_REQ for every tag on a fresh /dev/ublkcN, END_USER_RECOVERY
// (the driver waits for those fetches, records the new pid and unquiesces).
//
// Reissue is safe for every request this package serves: a read, a write of the same bytes to the
// same blocks, a flush, a discard and a write-zeroes give the same result when done twice, and the
// block layer never has two overlapping writes in flight that it expects ordered. What reissue
// cannot make safe is a write-back cache that died with acknowledged writes in memory; that is the
// caller's decision (RecoveryFailIO, and the state file's rule in internal/statefile).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/block"
)

// RecoveryMode is what the driver does with the device when its server dies.
type RecoveryMode int

const (
	// RecoveryNone: the driver fails the I/O and removes the disk.
	RecoveryNone RecoveryMode = iota
	// RecoveryReissue: the disk stays, I/O (including what was in flight) waits for RunRecover.
	RecoveryReissue
	// RecoveryFailIO: the disk stays, but I/O fails at once until a successor takes over
	// (UBLK_F_USER_RECOVERY_FAIL_IO, Linux 6.13+) — for a write-back cache, whose death may have
	// lost acknowledged writes. Without the kernel feature it is RecoveryReissue, and the
	// successor fails the I/O instead.
	RecoveryFailIO
)

// Errors of RunRecover. Each leaves the device as it found it.
var (
	// ErrNoRecovery: the kernel lacks UBLK_F_USER_RECOVERY, or the device was created without it.
	ErrNoRecovery = errors.New("ublk user recovery is not available")
	// ErrNoDevice: no ublk device has that id.
	ErrNoDevice = errors.New("no such ublk device")
	// ErrNotWaiting: the device is not waiting for a server (another one is serving it).
	ErrNotWaiting = errors.New("the ublk device is not waiting for a server")
	// ErrMismatch: the device's geometry is not the Device's.
	ErrMismatch = errors.New("the ublk device does not match the LUN")
)

// recoveryWait bounds how long RunRecover waits for the driver to release a dead server's
// /dev/ublkcN (START_USER_RECOVERY answers EBUSY until then).
const recoveryWait = 10 * time.Second

// orphanWait bounds how long RunRecover waits for a device whose server is dead to be quiesced.
// When every tag of a queue was in flight at the death, no cancelable command is left to tell the
// driver, and only its request timeout (ublk_timeout, 30 s by default) quiesces the device.
const orphanWait = 45 * time.Second

// recoveryFlags is what ADD_DEV asks for under mode, given the driver's features.
func recoveryFlags(mode RecoveryMode, feat uint64, log *zap.Logger) uint64 {
	if mode == RecoveryNone {
		return 0
	}
	if feat&FeatUserRecovery == 0 {
		log.Warn("the kernel lacks ublk user recovery: the device will not survive a restart of this gateway")
		return 0
	}
	flags := uint64(FeatUserRecovery)
	if mode == RecoveryFailIO && feat&FeatUserRecoveryFailIO != 0 {
		return flags | FeatUserRecoveryFailIO
	}
	if feat&FeatUserRecoveryReissue != 0 {
		flags |= FeatUserRecoveryReissue
	}
	return flags
}

// RunRecover is Run for a device a dead server left behind: it takes over /dev/ublkbN (id),
// serves dev on it until ctx is cancelled or the server fails, then detaches as Run does.
func RunRecover(ctx context.Context, dev block.Device, id uint32, opts Options, announce func(path string)) error {
	s, err := Recover(ctx, dev, id, opts)
	if err != nil {
		return err
	}
	return serveUntilDone(ctx, s, announce)
}

// Recover takes over device id, whose server died: it checks that the device waits for a server
// and matches dev, then START_USER_RECOVERY, Options.OnCreated, starts the queues,
// END_USER_RECOVERY. On failure the device is left waiting for the next attempt, never deleted.
func Recover(ctx context.Context, dev block.Device, id uint32, opts Options) (s *Server, err error) {
	s, _, feat, err := newServer(ctx, dev, opts)
	if err != nil {
		return nil, err
	}
	if feat&FeatUserRecovery == 0 {
		s.release()
		return nil, fmt.Errorf("%w: the kernel's ublk driver lacks it (features %#x)", ErrNoRecovery, feat)
	}
	if err := s.adopt(id); err != nil {
		s.release()
		return nil, err
	}
	defer func() {
		if err != nil {
			s.stopQueues()
			s.release()
		}
	}()
	if opts.OnCreated != nil {
		if err := opts.OnCreated(id); err != nil {
			return nil, err
		}
	}
	if err := s.startQueues(ctx); err != nil {
		return nil, err
	}
	if _, err := s.ctrl.do(cmdEndUserRecovery, ctrlCmd{DevID: id, QueueID: 0xffff, Data: [1]uint64{uint64(os.Getpid())}}, nil); err != nil {
		return nil, err
	}
	s.log.Info("ublk device recovered: the disk is served again", zap.String("dev", s.BlockPath()),
		zap.Int("queues", int(s.info.NrHWQueues)), zap.Int("depth", int(s.info.QueueDepth)))
	return s, nil
}

// adopt checks device id and starts its recovery (START_USER_RECOVERY); s.info and s.maxIO are
// then the device's.
func (s *Server) adopt(id uint32) error {
	info, err := s.waitForOrphan(id)
	if err != nil {
		return err
	}
	s.info = info
	s.nameDevice()
	params, err := s.ctrl.Params(id)
	if err != nil {
		return err
	}
	if err := checkGeometry(params, s.dev.Size(), s.lim); err != nil {
		return err
	}
	s.maxIO = min(int(info.MaxIOBufBytes), int(params.Basic.MaxSectors)<<sectorShift)
	if err := checkPoolClass(s.pool, s.maxIO); err != nil {
		return err
	}
	return s.startRecovery(id)
}

// checkPoolClass refuses a pool whose largest buffer is smaller than the device's requests: the
// device keeps the request size it was created with, and every tag's buffer must be one pool
// buffer (Start lowers the size to the pool's instead; a recovered device cannot).
func checkPoolClass(p BufferPool, maxIO int) error {
	mc, ok := p.(interface{ MaxClass() int })
	if !ok || mc.MaxClass() >= maxIO {
		return nil
	}
	return fmt.Errorf("%w: the device takes requests of up to %d bytes, the buffer pool's largest buffer is %d bytes (raise --buffer-memory or start with the flags the device was created with)",
		ErrMismatch, maxIO, mc.MaxClass())
}

// DeviceReissues reports whether device id would hand the requests its server holds to the next
// server (UBLK_F_USER_RECOVERY_REISSUE) when the server goes: what a planned restart needs.
// Without it the driver fails them with EIO (ublk_drv's __ublk_fail_req), and with
// UBLK_F_USER_RECOVERY_FAIL_IO it fails every request until the next server is up.
func DeviceReissues(id uint32) (bool, error) {
	ctrl, err := OpenControl("")
	if err != nil {
		return false, err
	}
	defer ctrl.Close()
	info, err := ctrl.DevInfo(id)
	if err != nil {
		return false, fmt.Errorf("ublk: device %d: %w", id, err)
	}
	const want = FeatUserRecovery | FeatUserRecoveryReissue
	return info.Flags&want == want && info.Flags&FeatUserRecoveryFailIO == 0, nil
}

// waitForOrphan returns the device's info once it waits for a server. A device that is still
// live while the pid that served it is gone gets orphanWait to become quiesced.
func (s *Server) waitForOrphan(id uint32) (DevInfo, error) {
	deadline := time.Now().Add(orphanWait)
	logged := false
	for {
		info, err := s.ctrl.DevInfo(id)
		if errors.Is(err, unix.ENODEV) {
			return info, fmt.Errorf("%w: /dev/ublkb%d", ErrNoDevice, id)
		}
		if err != nil {
			return info, err
		}
		if info.Flags&FeatUserRecovery == 0 {
			return info, fmt.Errorf("%w: device %d was created without it", ErrNoRecovery, id)
		}
		switch {
		case info.State == devStateQuiesced || info.State == devStateFailIO:
			return info, nil
		case info.State == devStateLive && pidAlive(int(info.UblksrvPID)) && info.UblksrvPID != int32(os.Getpid()):
			return info, fmt.Errorf("%w: /dev/ublkb%d is live, served by pid %d", ErrNotWaiting, id, info.UblksrvPID)
		case info.State == devStateDead:
			return info, fmt.Errorf("%w: /dev/ublkb%d was never started (state dead)", ErrNotWaiting, id)
		case time.Now().After(deadline):
			return info, fmt.Errorf("%w: /dev/ublkb%d is still %s after %v", ErrNotWaiting, id, info.StateName(), orphanWait)
		case !logged:
			logged = true
			s.log.Info("waiting for the kernel to quiesce the device of the dead server (at most its request timeout)",
				zap.Int32("dead_pid", info.UblksrvPID), zap.String("state", info.StateName()))
		}
		time.Sleep(50 * time.Millisecond) // the driver's quiesce work runs after the old server's exit
	}
}

// startRecovery sends START_USER_RECOVERY, retrying while the driver answers EBUSY: the dead
// server's /dev/ublkcN is released only when the last of its references is gone.
func (s *Server) startRecovery(id uint32) error {
	deadline := time.Now().Add(recoveryWait)
	for {
		_, err := s.ctrl.do(cmdStartUserRecovery, ctrlCmd{DevID: id, QueueID: 0xffff}, nil)
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkGeometry refuses to serve dev on a device whose size or block size differ.
func checkGeometry(p Params, size int64, lim block.Limits) error {
	devSize := int64(p.Basic.DevSectors) << sectorShift
	bs := int64(1) << p.Basic.LogicalBSShift
	if devSize != size || bs != int64(lim.LogicalBlockSize) {
		return fmt.Errorf("%w: the device has %d bytes in %d-byte blocks, the LUN %d in %d-byte blocks",
			ErrMismatch, devSize, bs, size, lim.LogicalBlockSize)
	}
	return nil
}

// pidAlive reports whether pid names a running process: one that exists (signal 0) and is not a
// zombie, whose files — the old /dev/ublkcN among them — are already closed.
func pidAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := unix.Kill(pid, 0); err != nil && !errors.Is(err, unix.EPERM) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// "pid (comm) S ...": the state follows the last ')', as comm may hold anything.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || (stat[i+2] != 'Z' && stat[i+2] != 'X')
}
