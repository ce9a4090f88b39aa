package iser

import (
	"context"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/backend/iser/internal/session"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/rawio"
)

// pipeReadExecutor is implemented by an Executor that can start a read whose data it splices into a
// pipe (session.Session over TCP): see session.Session.SubmitToPipe.
type pipeReadExecutor interface {
	SubmitToPipe(cmd *scsi.Command, n, pipeW int, resp *scsi.Response, done session.Completer) bool
}

var _ pipeReadExecutor = (*session.Session)(nil)
var _ block.PipeSubmitter = (*Device)(nil)

// SubmitReadToPipe implements block.PipeSubmitter: like SubmitAt for a read, but the session's
// reader splices the Data-In segments from the socket into pipe, so the data never passes through
// this process's memory. As with SubmitAt, only a clean GOOD with all n bytes in the pipe
// completes on that path; a final SCSI error (e.g. MEDIUM ERROR) is reported as ReadAt would. On
// anything else (a residual, a status the retry policy retries, a connection loss, a pipe that
// could not take the data) the request is served again by the synchronous path on a goroutine of
// its own: the pipe is drained, ReadAt (retries, replay, failover) reads into a buffer, and the
// buffer is written into the pipe before done is called.
func (d *Device) SubmitReadToPipe(ctx context.Context, pipe block.Pipe, n int, off int64, done block.Completion) bool {
	if d.closed.Load() || n <= 0 || int64(n) > int64(d.maxXferBlocks)<<d.shift {
		return false
	}
	if block.CheckRange(d, off, int64(n)) != nil {
		return false
	}
	pth := d.asyncPath()
	if pth == nil {
		return false
	}
	sub, ok := pth.ex.(pipeReadExecutor)
	if !ok {
		return false
	}
	r := d.get()
	d.buildRead(&r.cmd, n, off)
	d.startAsync(r, asyncReq{ctx: ctx, off: off, path: pth, done: done, toPipe: true, pipe: pipe, n: n})
	if !sub.SubmitToPipe(&r.cmd, n, pipe.W, &r.resp, r) {
		d.unstartAsync(r)
		return false
	}
	return true
}

// buildRead is buildRW for a read of n bytes with no buffer (the data goes to a pipe).
func (d *Device) buildRead(cmd *scsi.Command, n int, off int64) {
	lba := uint64(off) >> d.shift
	blocks := uint64(n) >> d.shift
	if d.use16 {
		cmd.Read16(lba, uint32(blocks), false, nil)
	} else {
		cmd.Read10(uint32(lba), uint16(blocks), false, nil)
	}
}

// pipeBufs holds the buffers of the fallback path (rare: only failed fast-path reads use it).
var pipeBufs sync.Pool

// readToPipeSync serves a read that SubmitReadToPipe started but could not finish on the fast
// path: it empties the pipe (only the session's reader wrote to it, and it is done with it),
// reads the range with ReadAt, writes the bytes into the pipe, and completes the request.
func (d *Device) readToPipeSync(a asyncReq) {
	var buf []byte
	if bp, ok := pipeBufs.Get().(*[]byte); ok && cap(*bp) >= a.n {
		buf = (*bp)[:a.n]
	} else {
		buf = make([]byte, a.n)
	}
	err := drainPipe(a.pipe.R, buf)
	if err == nil {
		err = d.ReadAt(a.ctx, buf, a.off)
	}
	if err == nil {
		if err = fillPipe(a.pipe.W, buf); err != nil {
			err = fmt.Errorf("iser: read [%d, +%d) into a pipe: %w: %w", a.off, a.n, err, block.ErrIO)
		}
	}
	pipeBufs.Put(&buf)
	a.done.Complete(err)
}

// drainPipe empties the non-blocking pipe, using scratch as the bin.
func drainPipe(pipeR int, scratch []byte) error {
	for {
		k, err := unix.Read(pipeR, scratch)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN || (err == nil && k == 0):
			return nil
		case err != nil:
			return fmt.Errorf("iser: draining a pipe: %w: %w", err, block.ErrIO)
		}
	}
}

// fillPipe writes b into the empty, non-blocking pipe, which has room for it (the
// block.PipeSubmitter contract); EAGAIN means it has not.
func fillPipe(pipeW int, b []byte) error {
	_, err := rawio.WriteAll(pipeW, b)
	return err
}
