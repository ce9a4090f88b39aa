package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/internal/statefile"
)

// attachOrReattach is nbd.Attach with the takeover of attach --name: the device gets a backend
// identifier naming the gateway and the LUN; a device a dead predecessor left configured gets
// fresh sockets (nbd.Reattach) instead of a new device being made; the state is recorded.
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
			return a, t.record(statefile.KindNBD, t.prev.DevID)
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
	return a, t.record(statefile.KindNBD, idx)
}
