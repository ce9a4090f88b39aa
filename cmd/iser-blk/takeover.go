package main

// Taking over a device across a restart of the gateway (issue 17). With --name, attach keeps
// RUNDIR/NAME.json (internal/statefile) for as long as its device exists; started again with
// the same name after the old process died, it finds the device the file names and serves it
// again instead of creating another. When the dead gateway's write-back cache could have held
// acknowledged writes, the device is taken over but fenced: every request fails with EIO.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/statefile"
)

// errNoResume marks a device that cannot be taken over (exitNoResume): the state file is
// unreadable or names another LUN, or the device is not waiting for a server.
var errNoResume = errors.New("cannot take the device over")

// takeoverFlags are the --name and --run-dir of attach (serviceFlags registers them): an explicit
// --name gives the device a state file; the default name (the kernel's device) does not.
type takeoverFlags struct {
	name   string
	runDir string
}

// takeover is what one attach knows about its predecessor: where its state goes, the LUN it
// serves, and the state a dead predecessor left (nil: none, create a device).
type takeover struct {
	path      string
	name      string
	lun       statefile.Identity
	cacheMode string
	prev      *statefile.State
	log       *zap.Logger

	// What a planned restart (gateway_restart.go) needs: the gate in front of the served device,
	// the device's id once recorded, and the frontend's check that the kernel device can wait
	// for the next process image.
	gate  *restartGate
	mu    sync.Mutex // guards kind, devID, canWait: set by the frontend, read by a restart
	kind  string
	devID int
	// canWait reports why the kernel device would not wait for a successor (nil: it would).
	canWait func() error
}

// prepareTakeover reads NAME.json for attach --name. A missing file means a fresh device; an
// unreadable, corrupt or foreign one, or one for another kind of device, stops the attach
// (errNoResume) so that a second device never appears by surprise.
func prepareTakeover(tf *takeoverFlags, kind, target, cacheMode string, dev block.Device, log *zap.Logger) (*takeover, error) {
	if tf.name == "" {
		return nil, nil
	}
	mode, err := cache.ParseMode(cacheMode) // "wb", "none", ...: the state file spells it one way
	if err != nil {
		return nil, usagef("%v", err)
	}
	cacheMode = mode.String()
	if err := control.ValidateName(tf.name); err != nil {
		return nil, usagef("--name: %v", err)
	}
	dir := control.RunDir(tf.runDir)
	if err := control.EnsureRunDir(dir); err != nil {
		return nil, err
	}
	// The identity is the URL without credentials, the size and the block size. The LUN's VPD
	// 0x83 name (Identity.DeviceID) is left empty: tgtd derives it from the target id and LUN
	// number, so it would refuse a legitimate successor when targets come back in another order
	// and still not tell two LUNs behind one IQN and number apart (9210660).
	t := &takeover{path: statefile.Path(dir, tf.name), name: tf.name, cacheMode: cacheMode,
		lun: statefile.Identity{Target: iser.RedactURL(target), Size: dev.Size(), BlockSize: dev.BlockSize()},
		log: log.With(zap.String("state_file", statefile.Path(dir, tf.name)))}
	prev, err := statefile.Read(t.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return t, nil
	case err != nil:
		return nil, fmt.Errorf("%w: %w; if no device is waiting for gateway %q, remove the file", errNoResume, err, tf.name)
	case prev.Kind != kind:
		return nil, fmt.Errorf("%w: %s names a %s device, this attach makes a %s one", errNoResume, t.path, prev.Kind, kind)
	}
	if err := prev.CheckIdentity(t.lun); err != nil {
		return nil, fmt.Errorf("%w: %w", errNoResume, err)
	}
	t.prev = &prev
	return t, nil
}

// record writes the state of a device this gateway now serves: Dirty exactly with a write-back
// cache, written before the device takes its first request.
func (t *takeover) record(kind string, devID int) error {
	if err := statefile.Write(t.path, t.state(kind, devID)); err != nil {
		return err
	}
	t.mu.Lock()
	t.kind, t.devID = kind, devID
	t.mu.Unlock()
	return nil
}

// forgetRecord undoes record's bookkeeping (not the file): the device is not this gateway's.
func (t *takeover) forgetRecord() {
	t.mu.Lock()
	t.kind, t.devID = "", 0
	t.mu.Unlock()
}

// state is what record writes: Dirty exactly with a write-back cache, or when the predecessor's
// was (a fenced device stays fenced for the next successor too).
func (t *takeover) state(kind string, devID int) statefile.State {
	st := statefile.Fresh(t.name, kind, devID, t.lun, t.cacheMode, os.Getpid())
	if t.prev != nil && t.prev.Dirty {
		st.Dirty = true
	}
	return st
}

// recordClean records, before a planned restart's re-exec, that every acknowledged write is on
// the target: the successor resumes even with a write-back cache.
func (t *takeover) recordClean() error { return t.recordAgain(true) }

// recordAgain rewrites the recorded device's state: clean, or as record wrote it.
func (t *takeover) recordAgain(clean bool) error {
	t.mu.Lock()
	kind, devID := t.kind, t.devID
	t.mu.Unlock()
	if kind == "" {
		return errors.New("the device's state was never recorded")
	}
	st := t.state(kind, devID)
	if clean {
		st.Dirty = false
	}
	return statefile.Write(t.path, st)
}

// recordFlushed records the state clean after the shutdown's final flush succeeded, when the
// device outlives this gateway (its state file is still there: a start that failed half-way, a
// detach that did not complete): every write it acknowledged is on the target, and the next
// gateway resumes instead of fencing the device for writes that were not lost. A fenced device
// stays fenced (the writes an earlier gateway may have lost are still lost); a state file
// already removed is not written again.
func (t *takeover) recordFlushed() {
	t.mu.Lock()
	recorded := t.kind != ""
	t.mu.Unlock()
	if !recorded || t.fenceReason() != "" {
		return
	}
	if _, err := statefile.Read(t.path); err != nil {
		return // forgotten with the device, or not ours to rewrite
	}
	if err := t.recordClean(); err != nil {
		t.log.Warn("could not record the state clean after the final flush: the next gateway will fence the device", zap.Error(err))
		return
	}
	t.log.Info("the device outlives this gateway with nothing unwritten: state recorded clean")
}

// setCanWait installs the frontend's check that its kernel device waits for a successor.
func (t *takeover) setCanWait(check func() error) {
	t.mu.Lock()
	t.canWait = check
	t.mu.Unlock()
}

// checkCanWait is canWait's answer (an error if none was installed: the device is not up).
func (t *takeover) checkCanWait() error {
	t.mu.Lock()
	check := t.canWait
	t.mu.Unlock()
	if check == nil {
		return errors.New("the kernel device is not set up yet")
	}
	return check()
}

// fenceReason is why the device is fenced ("" when it is served).
func (t *takeover) fenceReason() string {
	if t == nil || t.prev == nil {
		return ""
	}
	_, why := t.prev.Resumable()
	return why
}

// forget removes the state file once the device is gone.
func (t *takeover) forget() {
	if err := statefile.Remove(t.path); err != nil {
		t.log.Warn("could not remove the state file", zap.Error(err))
	}
}

// serveDevice is dev, or dev fenced when the predecessor's state is not resumable; the log says
// why and what the operator does next.
func (t *takeover) serveDevice(dev block.Device) block.Device {
	ok, why := t.prev.Resumable()
	if ok {
		return dev
	}
	t.log.Error("NOT resuming the device: every I/O on it fails with EIO", zap.String("why", why))
	return fence(dev, why)
}

// serving is what the frontend serves: without --name dev itself; with it dev (fenced when the
// predecessor's state says so) behind the gate a planned restart closes.
func (t *takeover) serving(dev block.Device) block.Device {
	if t == nil {
		return dev
	}
	if t.prev != nil {
		dev = t.serveDevice(dev)
	}
	t.gate = newRestartGate(dev)
	return t.gate
}

// forgetIfSet is forget when attach has a --name.
func (t *takeover) forgetIfSet() {
	if t != nil {
		t.forget()
	}
}

// failTakeover reports a takeover refused before any device was touched.
func failTakeover(err error) int {
	if errors.Is(err, errNoResume) {
		fmt.Fprintf(os.Stderr, "iser-blk attach: %v\n", err)
		return exitNoResume
	}
	return fail("attach", err)
}
