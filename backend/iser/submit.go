package iser

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser/internal/session"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
)

// asyncExecutor is implemented by an Executor that can start a command without waiting for it
// (session.Session, over TCP and iSER): see session.Session.Submit.
type asyncExecutor interface {
	Submit(cmd *scsi.Command, resp *scsi.Response, done session.Completer) bool
	Kick()
}

var _ asyncExecutor = (*session.Session)(nil)
var _ block.Submitter = (*Device)(nil)

// asyncReq is what a request started by SubmitAt carries besides its command.
type asyncReq struct {
	ctx   context.Context
	p     []byte
	off   int64
	write bool
	flags block.WriteFlags
	path  *path
	done  block.Completion
	// toPipe: a read started by SubmitReadToPipe (pipe.go), n bytes into pipe; p is nil.
	toPipe bool
	pipe   block.Pipe
	n      int
}

// SubmitAt implements block.Submitter: a read or write that fits one command is started on the
// least loaded path without a goroutine, and completed from the session's reader. Only the first
// attempt runs there. Anything but a clean GOOD (a connection loss, a status the retry policy
// would retry, a task aborted by the watchdog) hands the whole request to the synchronous path
// (ReadAt/WriteAt, with retries, replay on another path and recovery) on a goroutine of its own;
// a final SCSI error (e.g. MEDIUM ERROR) is reported as that path would report it.
//
// It declines (false) what that path must do itself: requests over one command's transfer
// limit, writes over the session's SubmitWriteMax (TCP: data that needs R2Ts or Data-Out PDUs),
// buffers iSER would have to bounce (the session declines them), FUA writes on a LUN
// without native FUA, and any request while commands failed by a connection loss wait to be
// replayed (they go first, see replay.go).
func (d *Device) SubmitAt(ctx context.Context, p []byte, off int64, write bool, flags block.WriteFlags, done block.Completion) bool {
	if d.closed.Load() || len(p) == 0 || int64(len(p)) > int64(d.maxXferBlocks)<<d.shift {
		return false
	}
	if block.CheckRange(d, off, int64(len(p))) != nil {
		return false
	}
	fua := write && flags&block.FUA != 0
	if write && (d.limits.ReadOnly || fua && !d.limits.CanFUA) {
		return false
	}
	pth := d.asyncPath()
	if pth == nil {
		return false
	}
	sub, ok := pth.ex.(asyncExecutor)
	if !ok {
		return false
	}
	if write {
		if l, ok := pth.ex.(block.SubmitWriteLimiter); ok && len(p) > l.SubmitWriteMax() {
			return false // the session would decline it after the command was built and started
		}
	}
	r := d.get()
	d.buildRW(&r.cmd, p, off, write, fua)
	d.startAsync(r, asyncReq{ctx: ctx, p: p, off: off, write: write, flags: flags, path: pth, done: done})
	if !sub.Submit(&r.cmd, &r.resp, r) {
		d.unstartAsync(r)
		return false
	}
	return true
}

// SubmitWriteMax implements block.SubmitWriteLimiter: the largest write SubmitAt takes on the
// path it would use now: one command's worth, less where the session says (over TCP its
// immediate-data limit).
func (d *Device) SubmitWriteMax() int {
	if d.closed.Load() || d.limits.ReadOnly {
		return 0
	}
	pth := d.asyncPath()
	if pth == nil {
		return 0
	}
	limit := int(int64(d.maxXferBlocks) << d.shift)
	if l, ok := pth.ex.(block.SubmitWriteLimiter); ok {
		limit = min(limit, l.SubmitWriteMax())
	}
	return limit
}

var _ block.SubmitWriteLimiter = (*Device)(nil)

// asyncPath is the path SubmitAt and SubmitReadToPipe start a request on, or nil when it must
// take the synchronous path instead: while commands failed by a connection loss wait to be
// replayed (they go first, see replay.go), or when no path is up (ReadAt/WriteAt wait for
// recovery).
func (d *Device) asyncPath() *path {
	if d.recovering && d.replays.n.Load() > 0 {
		return nil
	}
	pth := d.pick(nil)
	if pth == nil || !pth.up() {
		return nil
	}
	return pth
}

// startAsync makes r, whose command is built, the request a, counted as outstanding on a.path
// from now until Complete (or unstartAsync).
func (d *Device) startAsync(r *request, a asyncReq) {
	r.dev = d
	r.async = a
	if a.path.outstanding.Add(1) == 1 {
		a.path.touch() // the command watchdog measures from the first command after idle
	}
}

// unstartAsync undoes startAsync for a command the session declined, and frees r.
func (d *Device) unstartAsync(r *request) {
	r.async.path.outstanding.Add(-1)
	r.async = asyncReq{}
	d.put(r)
}

// length is the request's size in bytes.
func (a *asyncReq) length() int64 {
	if a.toPipe {
		return int64(a.n)
	}
	return int64(len(a.p))
}

// Kick implements block.Submitter: it sends the commands SubmitAt queued on every path.
func (d *Device) Kick() {
	for _, p := range d.paths {
		if s, ok := p.ex.(asyncExecutor); ok {
			s.Kick()
		}
	}
}

// Complete implements session.Completer for a request started by SubmitAt. It runs on the
// session's reader goroutine.
func (r *request) Complete(err error) {
	if f := r.CompleteBatched(err); f != nil {
		f.Flush()
	}
}

// CompleteBatched is Complete for the session's reader, which completes the responses of one read
// in a row and flushes what the requests' block.BatchCompletion left waiting before it reads
// again (session.BatchCompleter).
func (r *request) CompleteBatched(err error) block.Flusher {
	d, a := r.dev, r.async
	p := a.path
	p.outstanding.Add(-1)
	p.commands.Add(1)
	if err == nil && scsi.Classify(&r.resp) == scsi.RetryNo {
		p.touch()
		if d.recovering && p.escalation.Load() != 0 {
			p.escalation.Store(0) // progress (see runRecovering)
		}
		op := "read"
		if a.write {
			op = "write"
		}
		if err = scsi.CheckCommand(&r.cmd, &r.resp); err != nil {
			err = opError(op, a.off, a.length(), err)
		} else if r.resp.Residual != 0 && a.toPipe {
			// Fewer bytes in the pipe than asked: let the synchronous path judge the target.
			d.log.Debug("spliced read retried through ReadAt", zap.Int64("offset", a.off), zap.Int("length", a.n),
				zap.Int64("residual", r.resp.Residual))
			r.async = asyncReq{}
			d.put(r)
			go d.readToPipeSync(a)
			return nil
		} else if r.resp.Residual != 0 {
			err = fmt.Errorf("iser: %s [%d, +%d): target reported residual %d: %w", op, a.off, len(a.p), r.resp.Residual, block.ErrIO)
		}
		r.async = asyncReq{}
		d.put(r)
		return block.CompleteBatched(a.done, err)
	}
	// Not a final answer: the synchronous path starts over (it retries, re-issues on another
	// path, waits for recovery), on its own goroutine since this one is the session's reader.
	if err == nil && d.retry.OnUnitAttention != nil {
		var se *scsi.SenseError
		if errors.As(scsi.CheckCommand(&r.cmd, &r.resp), &se) && se.Key == scsi.KeyUnitAttention {
			d.retry.OnUnitAttention(&r.cmd, &r.resp)
		}
	}
	r.async = asyncReq{}
	d.put(r)
	if a.toPipe {
		d.log.Debug("spliced read retried through ReadAt", zap.Int64("offset", a.off), zap.Int("length", a.n), zap.Error(err))
		go d.readToPipeSync(a)
		return nil
	}
	go d.rwSync(a)
	return nil
}

// rwSync serves a request that SubmitAt started but could not finish on the fast path with
// ReadAt/WriteAt, and completes it. It is a method taking a by value, not a closure, because a
// closure would capture Complete's a and so move it to the heap on every completion, the clean
// ones included.
func (d *Device) rwSync(a asyncReq) {
	var err error
	if a.write {
		err = d.WriteAt(a.ctx, a.p, a.off, a.flags)
	} else {
		err = d.ReadAt(a.ctx, a.p, a.off)
	}
	a.done.Complete(err)
}
