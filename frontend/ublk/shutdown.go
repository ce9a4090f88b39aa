package ublk

// The shutdown order. The kernel device may disappear only after every request it handed us has
// been answered, and no request may reach the Device after that:
//
//  1. STOP_DEV (stopDisk): the driver removes /dev/ublkbN (del_gendisk). New I/O on the disk
//     fails in the kernel; requests the block layer already queued are still dispatched to us and
//     served by the queues, which keep running; STOP_DEV returns when the last has completed, and
//     the driver then aborts every parked FETCH_REQ, so no further request can arrive.
//  2. The final flush of the Device: Shutdown does it itself; Detach leaves it to the caller (the
//     CLI flushes after Detach with progress reporting and a second-signal abort, the same code
//     as after an NBD detach).
//  3. teardown: the queues end, /dev/ublkcN is closed, DEL_DEV deletes the device, the buffers
//     go back to the pool.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Shutdown removes the device cleanly: STOP_DEV (the kernel fails new I/O and waits for the
// requests in flight, which the queues keep serving), Flush of the Device so every acknowledged
// write is durable, then the queues stop, /dev/ublkcN is closed and DEL_DEV removes the device.
// It does not close the Device. It is idempotent, and exclusive with Detach: later calls of
// either return the first result.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdownOnce.Do(func() {
		s.shutdownErr = s.shutdown(func() error { return s.dev.Flush(ctx) })
	})
	return s.shutdownErr
}

// Detach is Shutdown without the final flush: STOP_DEV drains the requests in flight, then the
// device is deleted. Every write the kernel was told is complete has reached the Device, but a
// Device with a volatile cache may still hold it: the caller must flush the Device afterwards
// (and should report that flush's progress, as the CLI does). Idempotent, like Shutdown.
func (s *Server) Detach() error {
	s.shutdownOnce.Do(func() { s.shutdownErr = s.shutdown(nil) })
	return s.shutdownErr
}

// shutdown stops the disk, runs flush (if any) and tears the device down, in that order.
func (s *Server) shutdown(flush func() error) error {
	var errs []error
	if err := s.stopDisk(); err != nil {
		errs = append(errs, err)
	}
	if flush != nil {
		if err := flush(); err != nil {
			errs = append(errs, fmt.Errorf("ublk: final flush: %w", err))
		}
	}
	s.teardown(true)
	return errors.Join(errs...)
}

// stopDisk sends STOP_DEV and returns once the disk is gone and every request it had is answered.
func (s *Server) stopDisk() error {
	t0 := time.Now()
	s.stopping.Store(true)
	// STOP_DEV waits for every request in flight; a backend request that never returns would
	// hold it forever, so after the drain timeout the requests' context is cancelled.
	stuck := time.AfterFunc(s.drain, func() {
		s.log.Warn("ublk requests still in flight after the drain timeout; cancelling them", zap.Duration("drain_timeout", s.drain))
		s.ioCancel()
	})
	defer stuck.Stop()
	if err := s.ctrl.StopDev(s.info.DevID); err != nil {
		return err
	}
	s.log.Info("ublk disk removed, in-flight requests drained", zap.Duration("took", time.Since(t0)))
	return nil
}

// teardown stops the queues, releases the character device, deletes the device and frees the
// buffers. With stopped false the disk was never started (Start failed).
func (s *Server) teardown(stopped bool) {
	s.stopQueues()
	if !stopped {
		// START_DEV may have got as far as adding the disk.
		_ = s.ctrl.StopDev(s.info.DevID)
	}
	if err := s.ctrl.DelDev(s.info.DevID); err != nil {
		s.log.Warn("ublk DEL_DEV failed", zap.Error(err))
	} else {
		s.log.Info("ublk device deleted")
	}
	s.release()
}

// stopQueues ends every queue and closes /dev/ublkcN. On a recoverable device whose disk is still
// there this hands the device back to the kernel to wait for the next server.
func (s *Server) stopQueues() {
	s.stopping.Store(true)
	for _, q := range s.queues {
		q.stop()
	}
	for _, q := range s.queues {
		<-q.exited
		q.closeWake()
		if q.err != nil && !errors.Is(q.err, errQueueAborted) {
			s.log.Warn("ublk queue ended with an error", zap.Uint16("queue", q.id), zap.Error(q.err))
		}
	}
	s.queues = nil
	if s.charFd >= 0 {
		unix.Close(s.charFd)
		s.charFd = -1
	}
}

// release closes the control device, cancels the requests' context and frees the buffers.
func (s *Server) release() {
	s.ctrl.Close()
	s.ioCancel()
	for _, b := range s.bufs {
		s.pool.Put(b)
	}
	s.bufs = nil
	for _, m := range s.anon {
		unix.Munmap(m)
	}
	s.anon = nil
}
