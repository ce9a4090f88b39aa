package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/internal/statefile"
)

// attachOrReattach is nbd.Attach with the takeover of attach --name: the device gets a backend
// identifier naming the gateway and the LUN; a device a dead predecessor left configured gets
// fresh sockets (nbd.Reattach) instead of a new device being made; the state is recorded before
// the device is announced. A device whose state cannot be recorded is not served: one this
// attach created is removed again, one it reattached is left waiting for the next successor.
func attachOrReattach(srv *nbd.Server, opts nbd.AttachOptions, t *takeover) (*nbd.Attachment, error) {
	if t == nil {
		return nbd.Attach(srv, opts)
	}
	opts.BackendID = "iser-blk:" + t.name + ":" + t.lun.Target
	if t.prev != nil && !opts.ForceIoctl {
		opts.Device = fmt.Sprintf("/dev/nbd%d", t.prev.DevID)
		t.log.Info("taking over the nbd device a previous gateway left", zap.String("dev", opts.Device),
			zap.Int("previous_pid", t.prev.PID), zap.String("cache", t.prev.CacheMode), zap.Bool("dirty", t.prev.Dirty))
		a, err := nbd.Reattach(srv, opts)
		switch {
		case err == nil:
			if err := t.record(statefile.KindNBD, t.prev.DevID); err != nil {
				abandonServer(srv) // the device waits for a successor again
				return nil, err
			}
			t.setCanWait(nbdCanWait(a, opts))
			return a, nil
		case errors.Is(err, nbd.ErrNoDevice):
			t.log.Warn("the device the state file names is not configured any more; attaching afresh", zap.Error(err))
			if ok, why := t.prev.Resumable(); !ok {
				t.log.Error("the previous gateway may have lost acknowledged writes: check the filesystem (fsck) before mounting", zap.String("why", why))
			}
			t.prev = nil
		case errors.Is(err, nbd.ErrNotWaiting):
			return nil, fmt.Errorf("%w: %w", errNoResume, err)
		default:
			return nil, err
		}
	}
	a, err := nbd.Attach(srv, opts)
	if err != nil {
		return nil, err
	}
	// The index is known only now when the kernel picked it: the state goes in before the path
	// is announced, the only moment a filesystem could start writing.
	idx, _ := strconv.Atoi(strings.TrimPrefix(a.Path(), "/dev/nbd"))
	if err := t.record(statefile.KindNBD, idx); err != nil {
		removeAttached(a, srv, t.log)
		return nil, err
	}
	t.setCanWait(nbdCanWait(a, opts))
	return a, nil
}

// nbdCanWait refuses a planned restart of a device the kernel would not keep for a successor:
// one configured through ioctls (the device goes with the process's NBD_DO_IT) or with no
// dead-connection timeout (the kernel fails the I/O as soon as the old image's sockets close).
func nbdCanWait(a *nbd.Attachment, opts nbd.AttachOptions) func() error {
	return func() error {
		switch {
		case !a.Reconfigurable():
			return fmt.Errorf("%s is configured through ioctls, which do not outlive the gateway (attach without --nbd-ioctl, with the nbd netlink family)", a.Path())
		case opts.DeadConnTimeout < time.Second:
			return fmt.Errorf("%s has no dead-connection timeout (--dead-conn-timeout %v): the kernel would fail its I/O while the gateway re-executes", a.Path(), opts.DeadConnTimeout)
		}
		return nil
	}
}

// removeAttached disconnects a device this attach created but cannot serve, and stops srv.
func removeAttached(a *nbd.Attachment, srv *nbd.Server, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Detach(ctx); err != nil {
		log.Error("removing the nbd device whose state could not be recorded", zap.Error(err))
	}
	abandonServer(srv)
}

// abandonServer closes srv's connections at once: a reattached device then waits again.
func abandonServer(srv *nbd.Server) { _ = srv.Close() } // the connections close either way
