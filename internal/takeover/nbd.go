package takeover

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/statefile"
	"github.com/iser-blk/iser-blk/internal/udevname"
)

// NBDKernel is the kernel calls of AttachNBD: frontend/nbd's Attach and Reattach in production.
type NBDKernel struct {
	Attach   func(*nbd.Server, nbd.AttachOptions) (*nbd.Attachment, error)
	Reattach func(*nbd.Server, nbd.AttachOptions) (*nbd.Attachment, error)
}

// KernelNBD is the real kernel.
var KernelNBD = NBDKernel{Attach: nbd.Attach, Reattach: nbd.Reattach}

// ErrUnfenced is AttachNBD's answer when the device a fenced state named is gone: the fence
// protected the filesystem on that device, and a new device must not inherit it, but srv serves
// the fenced stack. The caller builds a server on Serving again (no fence now) and calls
// AttachNBD with it, which makes a new device.
var ErrUnfenced = errors.New("the fenced device is gone: a new one is served unfenced")

// AttachNBD is nbd.Attach with the takeover: the device gets a backend identifier naming the
// gateway and the LUN; a device a dead predecessor left configured gets fresh sockets
// (Reattach) instead of a new device being made. The state is recorded before the device can
// take a request: before Reattach, which hands the kernel sockets it sends the requests it held
// on at once, and before a new device is announced. A device whose state cannot be recorded is
// not served: one this attach created is removed again, one left by a predecessor waits for the
// next successor with the predecessor's state put back.
func (t *Takeover) AttachNBD(k NBDKernel, srv *nbd.Server, opts nbd.AttachOptions) (*nbd.Attachment, error) {
	opts.BackendID = udevname.BackendID(t.name, t.lun.Target) // udev names the device by it too
	opts.Stored = t.takeStored()
	defer closeFiles(opts.Stored) // Attach and Reattach close them, but a failure before them must too
	if t.Previous() != nil && !opts.ForceIoctl {
		a, err := t.reattachNBD(k, srv, opts)
		if a != nil || err != nil {
			return a, err
		}
		// the device is gone: make a new one below
	}
	a, err := k.Attach(srv, opts)
	if err != nil {
		return nil, err
	}
	// The index is known only now when the kernel picked it: the state goes in before the path
	// is announced, the only moment a filesystem could start writing.
	idx, _ := strconv.Atoi(strings.TrimPrefix(a.Path(), "/dev/nbd"))
	if err := t.Record(modes.NBD, idx); err != nil {
		removeAttached(a, srv, t.log)
		return nil, err
	}
	t.SetCanWait(nbdCanWait(a, opts))
	t.SetIntake(a)
	return a, nil
}

// reattachNBD takes over the device the predecessor's state names: its attachment, or (nil,
// nil) when the device is gone and a new one is to be made with srv, or ErrUnfenced when srv
// serves a fence that no longer applies.
func (t *Takeover) reattachNBD(k NBDKernel, srv *nbd.Server, opts nbd.AttachOptions) (*nbd.Attachment, error) {
	prev := *t.Previous()
	opts.Device = fmt.Sprintf("/dev/nbd%d", prev.DevID)
	t.log.Info("taking over the nbd device a previous gateway left", zap.String("dev", opts.Device),
		zap.Int("previous_pid", prev.PID), zap.Stringer("cache", prev.CacheMode), zap.Bool("dirty", prev.Dirty))
	if err := t.Record(modes.NBD, prev.DevID); err != nil {
		return nil, err // nothing served: the device still waits, its state file as it was (atomic write)
	}
	a, err := k.Reattach(srv, opts)
	switch {
	case err == nil:
		t.SetCanWait(nbdCanWait(a, opts))
		t.SetIntake(a)
		return a, nil
	case errors.Is(err, nbd.ErrNoDevice):
		t.log.Warn("the device the state file names is not configured any more; attaching afresh", zap.Error(err))
		ok, why := prev.Resumable()
		t.dropPrevious()
		if !ok {
			t.log.Error("the previous gateway may have lost acknowledged writes: check the filesystem (fsck) before mounting", zap.String("why", why))
			return nil, ErrUnfenced
		}
		return nil, nil
	}
	// The device stays as the predecessor left it, and so does what its state file says: this
	// gateway recorded nothing of its own (a shutdown's RecordFlushed leaves the file alone).
	if rerr := statefile.Write(t.path, prev); rerr != nil {
		t.log.Error("could not put the previous gateway's state back", zap.Error(rerr))
	}
	t.forgetRecord()
	if errors.Is(err, nbd.ErrNotWaiting) {
		return nil, fmt.Errorf("%w: %w", ErrNoResume, err)
	}
	return nil, err
}

// takeStored takes what the descriptor store passed this process: the sockets the previous
// gateway left for the device its state names, under that gateway's name
// (nbd.StoredSocketsName: an entry from any other process is stale, its streams possibly
// stopped mid-request). Everything else it closes. It removes every entry from the store first,
// so that no later start is given them again, and so that sockets Reattach does not serve die
// with this process's copies: the kernel takes new sockets only for dead connections.
func (t *Takeover) takeStored() []*os.File {
	if t.fdStore == nil {
		return nil
	}
	want := ""
	if prev := t.Previous(); prev != nil && prev.Kind == modes.NBD {
		want = nbd.StoredSocketsName(prev.DevID, prev.PID)
	}
	var keep []*os.File
	for name, files := range t.fdStore.Take() {
		if err := t.fdStore.Remove(name); err != nil {
			t.log.Warn("could not remove descriptors from the store", zap.String("name", name), zap.Error(err))
		}
		if name == want {
			keep = files
			continue
		}
		closeFiles(files)
		t.log.Warn("closed descriptors the store kept for another gateway process or device",
			zap.String("name", name), zap.Int("descriptors", len(files)), zap.String("want", want))
	}
	return keep
}

// closeFiles closes fs; a file closed already is left as it is (os.File knows).
func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// nbdCanWait refuses a hand-over of a device the kernel would not keep for a successor: one
// configured through ioctls (the device goes with the process's NBD_DO_IT) or with no
// dead-connection timeout (the kernel fails the I/O as soon as the old image's sockets close).
func nbdCanWait(a *nbd.Attachment, opts nbd.AttachOptions) func() error {
	return func() error {
		switch {
		case !a.Reconfigurable():
			return fmt.Errorf("%s is configured through ioctls, which do not outlive the gateway (attach without --nbd-ioctl, with the nbd netlink family)", a.Path())
		case opts.DeadConnTimeout < time.Second:
			return fmt.Errorf("%s has no dead-connection timeout (--dead-conn-timeout %v): the kernel would fail its I/O while no gateway serves it", a.Path(), opts.DeadConnTimeout)
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
	AbandonServer(srv)
}

// AbandonServer closes srv's connections at once: a reattached device then waits again.
func AbandonServer(srv *nbd.Server) { _ = srv.Close() } // the connections close either way
