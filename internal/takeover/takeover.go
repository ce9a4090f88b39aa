// Package takeover carries a kernel device across gateway processes: the state file a named
// gateway keeps (internal/statefile) while its device exists, and what a gateway started again
// under the same name does with what its predecessor left. A device that is still waiting for a
// server is served again instead of a second device being made; a device whose predecessor may
// have lost acknowledged writes is served fenced (internal/fence: every I/O fails).
//
// The state file says dirty exactly while acknowledged writes may be missing from the target:
// the gate in front of the served stack (internal/gate) records dirty before the first write
// after a clean point, and clean after a flush that leaves nothing dirty. A crash of an idle or
// just-flushed write-back gateway therefore resumes like cache off; one with dirty pages fences.
//
// NBD and ublk are wired the same way (nbd.go, ublk.go): the state is recorded before the device
// can take a request, a device left by a predecessor is taken over, and the state file goes
// once the device is deleted. The kernel calls are options, so tests drive every outcome.
//
// Lock order: Takeover.mu is a leaf; it is never held across a file write's caller or the gate.
package takeover

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/fence"
	"github.com/iser-blk/iser-blk/internal/gate"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/statefile"
)

// ErrNoResume marks a device that cannot be taken over: the state file is unreadable or names
// another LUN or kind of device, or the device is not waiting for a server. The attach stops
// (exit 7) so that a second device never appears by surprise.
var ErrNoResume = errors.New("cannot take the device over")

// Options describe the gateway that prepares a takeover.
type Options struct {
	Dir  string         // the run directory (control.RunDir)
	Name string         // the gateway's --name, already validated
	Kind modes.Frontend // modes.Ublk or modes.NBD
	// LUN is the identity a predecessor's state must match (credentials already redacted).
	LUN       statefile.Identity
	CacheMode modes.Cache
	// CacheDev is the gateway's --cache-dev (absolute), "" for none. A write-back log there keeps
	// every acknowledged write across a crash of the process, so Prepare records such a gateway
	// as write-through whatever CacheMode says: its death never fences.
	CacheDev string
	// FDStore is the supervisor's descriptor store (sdnotify.FDStore under systemd; nil: none):
	// a kernel NBD device's predecessor that stopped with --keep may have left its sockets there.
	FDStore FDStore
	Log     *zap.Logger
}

// FDStore is a supervisor's store of descriptors kept across a stop and the next start.
type FDStore interface {
	// Take returns what the store passed this process at start, by name.
	Take() map[string][]*os.File
	// Remove drops what the store keeps under name.
	Remove(name string) error
}

// Takeover is what one gateway knows about its predecessor and records for its successor.
type Takeover struct {
	path      string
	name      string
	lun       statefile.Identity
	cacheMode modes.Cache
	cacheDev  string
	fdStore   FDStore
	log       *zap.Logger

	mu        sync.Mutex // guards everything below
	prev      *statefile.State
	kind      modes.Frontend // "" until Record; again "" after forgetRecord
	devID     int
	dirty     bool // what the file says now (this gateway's dirty mark)
	forgotten bool // the device is gone and the file with it
	canWait   func() error
	intake    Intake // nil: the frontend's connections do not outlive an exec
	gate      *gate.Gate
}

// Intake is what a frontend whose connections can outlive its process image (kernel NBD; only
// one configured through netlink passes CheckCanWait, and so reaches a hand-over) offers a
// hand-over (internal/gateway): stop taking requests at a boundary once those read are
// answered, take them again if the hand-over fails, and hand the connections on: to the next
// image as an environment entry ("NAME=VALUE"), or to a descriptor store for a successor
// (store: FDStore-like, sending fds under name).
type Intake interface {
	PauseIntake(ctx context.Context) error
	ResumeIntake()
	ExecSockets() (string, error)
	StoreSockets(store func(name string, fds []int) error) error
}

// Prepare reads NAME.json. A missing file means a fresh device; an unreadable, corrupt or
// foreign one, or one for another kind of device, is ErrNoResume.
func Prepare(opts Options) (*Takeover, error) {
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	if opts.CacheDev != "" {
		opts.CacheMode = modes.WriteThrough // every acknowledged write is in the log
	}
	path := statefile.Path(opts.Dir, opts.Name)
	t := &Takeover{path: path, name: opts.Name, cacheMode: opts.CacheMode, cacheDev: opts.CacheDev, lun: opts.LUN,
		fdStore: opts.FDStore, log: opts.Log.With(zap.String("state_file", path))}
	prev, err := statefile.Read(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return t, nil
	case err != nil:
		return nil, fmt.Errorf("%w: %w; if no device is waiting for gateway %q, remove the file", ErrNoResume, err, opts.Name)
	case prev.Kind != opts.Kind:
		return nil, fmt.Errorf("%w: %s names a %s device, this attach makes a %s one", ErrNoResume, path, prev.Kind, opts.Kind)
	}
	if err := prev.CheckIdentity(opts.LUN); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoResume, err)
	}
	if prev.CacheDev != "" && prev.CacheDev != opts.CacheDev {
		// Served without that log, the device would show the target's older data.
		return nil, fmt.Errorf("%w: the device's data is partly in the cache device %s (not yet written back); attach with --cache-dev %s",
			ErrNoResume, prev.CacheDev, prev.CacheDev)
	}
	t.prev = &prev
	return t, nil
}

// Path is the state file.
func (t *Takeover) Path() string { return t.path }

// Previous is the state a predecessor left (nil: none, or the device it named is gone).
func (t *Takeover) Previous() *statefile.State {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.prev == nil {
		return nil
	}
	p := *t.prev
	return &p
}

// dropPrevious forgets the predecessor's state: the device it named is gone.
func (t *Takeover) dropPrevious() {
	t.mu.Lock()
	t.prev = nil
	t.mu.Unlock()
}

// FenceReason is why the device is fenced ("" when it is served). Safe on a nil Takeover.
func (t *Takeover) FenceReason() string {
	if t == nil {
		return ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.fenceReasonLocked()
}

func (t *Takeover) fenceReasonLocked() string {
	if t.prev == nil {
		return ""
	}
	_, why := t.prev.Resumable()
	return why
}

// Serving is what the frontend serves: dev (fenced when the predecessor's state says so) behind
// a new gate that closes for a hand-over and keeps the dirty mark of a write-back cache.
func (t *Takeover) Serving(dev block.Device) *gate.Gate {
	t.mu.Lock()
	why := t.fenceReasonLocked()
	inherited := t.prev != nil && t.prev.Dirty
	t.mu.Unlock()
	if why != "" {
		t.log.Error("NOT resuming the device: every I/O on it fails with EIO", zap.String("why", why))
		dev = fence.New(dev, why)
	}
	opts := gate.Options{Dirty: inherited}
	if t.cacheMode == modes.WriteBack {
		opts.Recorder = t
	}
	g := gate.New(dev, opts)
	t.mu.Lock()
	t.gate = g
	t.mu.Unlock()
	return g
}

// Gate is the gate Serving made last (nil before).
func (t *Takeover) Gate() *gate.Gate {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.gate
}

// Record writes the state of a device this gateway now serves, before the device takes its
// first request: clean (nothing is acknowledged yet), unless the predecessor's was dirty (a
// fenced device stays fenced for the next successor too).
func (t *Takeover) Record(kind modes.Frontend, devID int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.stateLocked(kind, devID)
	if err := statefile.Write(t.path, st); err != nil {
		return err
	}
	t.kind, t.devID, t.forgotten = kind, devID, false
	return nil
}

func (t *Takeover) stateLocked(kind modes.Frontend, devID int) statefile.State {
	st := statefile.Fresh(t.name, kind, devID, t.lun, t.cacheMode, os.Getpid())
	st.Dirty = t.dirty || (t.prev != nil && t.prev.Dirty)
	st.CacheDev = t.cacheDev
	return st
}

// forgetRecord undoes Record's bookkeeping (not the file): the device is not this gateway's.
func (t *Takeover) forgetRecord() {
	t.mu.Lock()
	t.kind, t.devID = "", 0
	t.mu.Unlock()
}

// RecordDirty implements gate.Recorder: acknowledged writes may now be missing from the target.
func (t *Takeover) RecordDirty() error { return t.rewrite(true) }

// RecordClean implements gate.Recorder: everything acknowledged is on the target. A fenced
// device stays dirty (the writes an earlier gateway may have lost are still lost); a device
// whose state was never recorded, or is gone, has no file to rewrite.
func (t *Takeover) RecordClean() error { return t.rewrite(false) }

func (t *Takeover) rewrite(dirty bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.forgotten || t.kind == "":
		if dirty {
			return errors.New("the device's state is not recorded by this gateway")
		}
		return nil
	case !dirty && t.fenceReasonLocked() != "":
		return nil
	}
	prevDirty := t.dirty
	t.dirty = dirty
	if err := statefile.Write(t.path, t.stateLocked(t.kind, t.devID)); err != nil {
		t.dirty = prevDirty || dirty // on failure assume the worse of the two
		return err
	}
	return nil
}

// SetCanWait installs the frontend's check that its kernel device waits for a successor.
func (t *Takeover) SetCanWait(check func() error) {
	t.mu.Lock()
	t.canWait = check
	t.mu.Unlock()
}

// SetIntake installs the frontend's Intake.
func (t *Takeover) SetIntake(in Intake) {
	t.mu.Lock()
	t.intake = in
	t.mu.Unlock()
}

// Intake is the frontend's, nil when it offers none.
func (t *Takeover) Intake() Intake {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.intake
}

// CheckCanWait is that check's answer (an error if none was installed: the device is not up).
func (t *Takeover) CheckCanWait() error {
	t.mu.Lock()
	check := t.canWait
	t.mu.Unlock()
	if check == nil {
		return errors.New("the kernel device is not set up yet")
	}
	return check()
}

// Forget removes the state file once the device is gone.
func (t *Takeover) Forget() {
	t.mu.Lock()
	t.forgotten = true
	t.mu.Unlock()
	if err := statefile.Remove(t.path); err != nil {
		t.log.Warn("could not remove the state file", zap.Error(err))
	}
}

// RecordFlushed records the state clean after the shutdown's final flush succeeded, when the
// device outlives this gateway (a start that failed half-way, a detach that did not complete,
// a stop that keeps it): every write it acknowledged is on the target, and the next gateway
// resumes instead of fencing the device for writes that were not lost.
func (t *Takeover) RecordFlushed() {
	t.mu.Lock()
	skip := t.kind == "" || t.forgotten || t.fenceReasonLocked() != "" || !t.dirty
	t.mu.Unlock()
	if skip {
		return
	}
	if err := t.RecordClean(); err != nil {
		t.log.Warn("could not record the state clean after the final flush: the next gateway will fence the device", zap.Error(err))
		return
	}
	t.log.Info("the device outlives this gateway with nothing unwritten: state recorded clean")
}
