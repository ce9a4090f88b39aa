package session

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
)

// maxTasks bounds the task table: the slot index lives in the low 16 bits of the ITT and a
// generation counter in the high 16 bits, so a stale tag from a reaped task never matches.
const maxTasks = 4096

// controlSlots are task slots reserved for control tasks (NOP-Out pings, Text, Logout, ABORT
// TASK). Without them, SCSI tasks abandoned while the target holds them (say a write waiting for
// Data-Out) could occupy every slot and leave no room for the ABORT TASK that frees them.
const controlSlots = 8

// maxOutstandingR2T bounds what we offer for MaxOutstandingR2T (the result is the minimum of both
// sides, RFC 7143 §13.17, so the target can never exceed it).
const maxOutstandingR2T = 64

// Task kinds.
const (
	kindSCSI uint8 = iota
	kindNOP
	kindText
	kindLogout
	kindTMF
)

// Events from the reader to a task's goroutine.
const (
	evR2T uint8 = iota + 1
	evDone
)

type event struct {
	kind             uint8
	ttt, off, length uint32
}

// task is one slot of the task table. Fields below mu are shared between the task's goroutine and
// the reader and are guarded by mu; the rest belong to whoever holds the slot.
type task struct {
	idx uint32
	gen uint32
	itt uint32
	// tag is the ITT while the task may receive PDUs, 0 otherwise. The owner stores it after
	// filling the task and before sending; the reader matches ITTs against it. The atomic store
	// and load order the owner's writes before the reader's reads.
	tag  atomic.Uint32
	kind uint8
	ev   chan event    // R2Ts and the final completion; capacity MaxOutstandingR2T+1
	sent chan error    // write results when another sender flushed this task's PDU
	win  chan struct{} // the CmdSN window has room for this task's command (waitWindow); capacity 1

	// Set by the owner before the command is sent, read-only afterwards.
	lun  uint64
	dir  scsi.Direction
	buf  []byte
	resp *scsi.Response
	// A read started by SubmitToPipe: its Data-In lands in the pipe whose write end is pipeW
	// (>= 0, see toPipe), pipeLen bytes in all, instead of buf (nil).
	pipeW   int
	pipeLen int
	// lent: the transport sent some of buf by reference (transport.OutPDU.Lent); while the
	// connection lives the task then lets its caller go only after the target answered
	// (lend.go). Written by whichever goroutine flushed the PDU before the owner's send
	// returns; read by the owner only.
	lent bool
	xfer transport.Task
	bhs  pdu.BHS // the owner's send scratch
	dout [16]pdu.BHS
	outs []transport.OutPDU // scratch for dout, capacity len(dout)

	// Reader-only progress.
	dataSN   uint32 // next expected Data-In DataSN
	received int    // bytes of Data-In received
	r2tSN    uint32 // next expected R2TSN
	// pipeErr is why a toPipe task's data did not all reach its pipe (transport.ErrPipeFull);
	// the rest of its Data-In is discarded and it completes with this error.
	pipeErr error

	cmdSN uint32 // CmdSN the command was sent with (for ABORT TASK's RefCmdSN)
	ref   uint32 // TMF tasks: the ITT of the task being aborted
	// TMF tasks sent by AbortOutstanding/ResetLUN (tmf.go): the function, and whether the tasks
	// it ends are live ones to fail with ErrTaskAborted (not only abandoned ones to reap).
	tmfFn   uint8
	endLive bool

	mu        sync.Mutex
	active    bool      // slot is in use
	async     Completer // a command started by Submit: no owner goroutine, the completer gets the end
	abandoned bool      // owner gave up (ctx); the reader reaps the slot
	completed bool      // final response seen
	err       error
	ctlBHS    pdu.BHS // control tasks: the response header
	ctlData   []byte  // control tasks: the response data
}

// conn is one logged-in connection with its task table.
type conn struct {
	s      *Session
	tc     transport.Conn
	portal string
	params login.Params
	log    *zap.Logger

	// What Submit takes on this connection (submit.go): the largest transfer, the largest write.
	submitMax, writeMax int

	tasks   []task
	free    chan uint32 // free SCSI slot indices [0, MaxTasks)
	ctlFree chan uint32 // free control slot indices [MaxTasks, MaxTasks+controlSlots)
	nSCSI   uint32

	// Sending: sendMu guards CmdSN assignment and the combining queue (see send.go). PDUs are
	// queued in CmdSN order; whichever sender finds no flush in progress writes the whole queue
	// in one batch while the others wait for their PDU to be on the wire.
	sendMu   sync.Mutex
	cmdSN    uint32 // next CmdSN
	queue    []queued
	spare    []queued
	flushing bool
	outs     []transport.OutPDU // flusher scratch

	winMu      sync.Mutex
	expCmdSN   atomic.Uint32
	maxCmdSN   atomic.Uint32
	winQ       []*task      // commands waiting for the window, first come first (winMu)
	winWaiters atomic.Int32 // len(winQ) plus waiters on their way in or out

	expStatSN atomic.Uint32

	closing    atomic.Bool // a logout is in progress: the target closing the socket is expected
	loggedOut  atomic.Bool // the target answered a Logout with success: shutdown closes gracefully
	done       chan struct{}
	doneOnce   sync.Once
	err        error
	readerDone chan struct{}

	lends bool // write data may go out by reference (Config.LendPages, lend.go)

	respBuf []byte     // reader scratch for response data segments
	batch   batchState // the reader's run of batched completions (batch.go)
}

func newConn(s *Session, tc transport.Conn, portal string, p *login.Params) *conn {
	c := &conn{
		s: s, tc: tc, portal: portal, params: *p,
		log:        s.log.With(zap.String("portal", portal)),
		tasks:      make([]task, s.cfg.MaxTasks+controlSlots),
		free:       make(chan uint32, s.cfg.MaxTasks),
		ctlFree:    make(chan uint32, controlSlots),
		nSCSI:      uint32(s.cfg.MaxTasks),
		cmdSN:      p.ExpCmdSN,
		done:       make(chan struct{}),
		readerDone: make(chan struct{}),
		lends:      s.cfg.LendPages,
		respBuf:    make([]byte, p.MaxRecvDataSegmentLength),
		batch:      batchState{flushes: make([]block.Flusher, 0, 8)},
		winQ:       make([]*task, 0, s.cfg.MaxTasks), // every SCSI task may wait: no growth later
	}
	c.submitMax, c.writeMax = c.submitLengthMax(), c.asyncWriteMax()
	c.expCmdSN.Store(p.ExpCmdSN)
	c.maxCmdSN.Store(p.MaxCmdSN)
	c.expStatSN.Store(p.StatSN + 1)
	evCap := int(min(p.MaxOutstandingR2T, maxOutstandingR2T)) + 1
	for i := range c.tasks {
		t := &c.tasks[i]
		t.idx, t.gen, t.pipeW = uint32(i), 1, -1
		t.ev = make(chan event, evCap)
		t.sent = make(chan error, 1)
		t.win = make(chan struct{}, 1)
		t.outs = make([]transport.OutPDU, 0, len(t.dout))
		if i < s.cfg.MaxTasks {
			c.free <- uint32(i)
		} else {
			c.ctlFree <- uint32(i)
		}
	}
	return c
}

func (c *conn) start() { go c.reader() }

func (c *conn) dead() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// shutdown ends the connection with err (first caller wins) and closes the transport, which
// makes the reader exit; the reader then reaps abandoned tasks. Unless the target answered a
// Logout, the close is an abort (transport.Aborter): what has not left the initiator yet is
// discarded, since its tasks may be re-issued on another connection. After a Logout Response
// nothing is left to discard, and the target usually closes first anyway.
func (c *conn) shutdown(err error) {
	c.doneOnce.Do(func() {
		c.err = err
		close(c.done)
		if a, ok := c.tc.(transport.Aborter); ok && !c.loggedOut.Load() {
			a.Abort()
		} else {
			c.tc.Close()
		}
	})
}

func (c *conn) connErr() error {
	return &ConnError{Target: c.s.cfg.TargetName, Portal: c.portal, Err: c.err}
}

func (c *conn) execute(ctx context.Context, cmd *scsi.Command, resp *scsi.Response) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if cmd.CDBLen == 0 || cmd.CDBLen > 16 {
		return fmt.Errorf("session: CDB length %d", cmd.CDBLen)
	}
	if len(cmd.Data) > 1<<32-1 {
		return fmt.Errorf("session: transfer of %d bytes is too large", len(cmd.Data))
	}
	t, err := c.acquire(ctx, kindSCSI)
	if err != nil {
		return err
	}
	t.lun, t.dir, t.buf, t.resp = cmd.LUN, cmd.Dir, cmd.Data, resp
	*resp = scsi.Response{}
	t.xfer = transport.Task{ITT: t.itt, Dir: cmd.Dir, Buf: cmd.Data}
	if cmd.Dir == scsi.DirWrite {
		t.xfer.Unsolicited, t.xfer.Immediate = c.params.UnsolicitedLimit(len(cmd.Data))
	}
	attr := uint8(cmd.Attr)
	if attr == uint8(scsi.AttrUntagged) {
		attr = uint8(scsi.AttrSimple) // every iSCSI task is tagged (ITT); Untagged buys nothing
	}
	hasUnsolicitedPDUs := t.xfer.Unsolicited > t.xfer.Immediate
	sc := pdu.SCSICommand{
		Final:                      !hasUnsolicitedPDUs,
		Read:                       cmd.Dir == scsi.DirRead,
		Write:                      cmd.Dir == scsi.DirWrite,
		Attr:                       attr,
		DataSegmentLength:          t.xfer.Immediate,
		LUN:                        cmd.LUN,
		ITT:                        t.itt,
		ExpectedDataTransferLength: uint32(len(cmd.Data)),
		CDB:                        cmd.CDB[:cmd.CDBLen],
	}
	if err := c.waitWindow(ctx, t); err != nil {
		c.release(t)
		return err
	}
	sc.CmdSN, sc.ExpStatSN = c.cmdSN, c.expStatSN.Load()
	t.cmdSN = c.cmdSN
	t.tag.Store(t.itt) // from here on the reader may route PDUs to the task
	c.cmdSN++
	sc.Encode(&t.bhs)
	err = c.submitLocked(transport.OutPDU{BHS: &t.bhs, Data: t.xfer.Buf[:t.xfer.Immediate], Task: &t.xfer, Lent: c.lendable(t)}, t.sent)
	if err != nil {
		c.shutdown(err)
		return c.finishAfterConnLoss(t, nil)
	}
	if hasUnsolicitedPDUs {
		// Unsolicited Data-Out PDUs (§13.10): TTT 0xffffffff, up to FirstBurstLength in total.
		if err := c.sendDataOut(t, pdu.ReservedTag, uint32(t.xfer.Immediate), uint32(t.xfer.Unsolicited-t.xfer.Immediate)); err != nil {
			c.shutdown(err)
			return c.finishAfterConnLoss(t, nil)
		}
	}
	return c.wait(ctx, t, nil)
}

// toPipe reports whether the task is a read started by SubmitToPipe.
func (t *task) toPipe() bool { return t.pipeW >= 0 }

// ctlResult receives a control task's response before its slot is released.
type ctlResult struct {
	bhs  pdu.BHS
	data []byte
}

// takeResult copies a completed task's outcome (t.mu held).
func (t *task) takeResult(out *ctlResult) error {
	if out != nil && t.completed {
		out.bhs = t.ctlBHS
		out.data = append(out.data[:0], t.ctlData...)
	}
	return t.err
}

// wait runs the task's side of the data phase until the final response.
func (c *conn) wait(ctx context.Context, t *task, out *ctlResult) error {
	ctxDone := ctx.Done()
	var ctxErr error // the caller's context ended while the task had lent pages (lend.go)
	for {
		select {
		case ev := <-t.ev:
			switch ev.kind {
			case evR2T:
				if err := c.sendDataOut(t, ev.ttt, ev.off, ev.length); err != nil {
					c.shutdown(err)
					if err := c.finishAfterConnLoss(t, nil); err == nil || ctxErr == nil {
						return err
					}
					return ctxErr
				}
			case evDone:
				t.mu.Lock()
				err := t.takeResult(out)
				t.mu.Unlock()
				c.release(t)
				if err != nil && ctxErr != nil {
					return ctxErr
				}
				return err
			}
		case <-ctxDone:
			if t.lent {
				// The target may still read the lent pages: the task cannot be abandoned. Ask
				// for its end and wait for that (or the connection's end) instead.
				ctxDone, ctxErr = nil, ctx.Err()
				go c.abortLent(t.lun, t.itt, t.cmdSN)
				continue
			}
			t.mu.Lock()
			if t.completed {
				err := t.takeResult(out)
				t.mu.Unlock()
				c.release(t)
				return err
			}
			t.abandoned = true
			itt, lun, cmdSN, kind := t.itt, t.lun, t.cmdSN, t.kind
			t.mu.Unlock()
			c.log.Debug("iSCSI task abandoned by its caller", zap.Uint32("itt", itt), zap.Error(ctx.Err()))
			if kind == kindSCSI {
				// Ask the target to abort it so the slot comes back soon (§11.5.1 ABORT TASK).
				go c.abort(lun, itt, cmdSN)
			}
			return ctx.Err()
		case <-c.done:
			err := c.finishAfterConnLoss(t, out)
			if err != nil && ctxErr != nil {
				return ctxErr
			}
			return err
		}
	}
}

// finishAfterConnLoss completes a task whose connection is gone. A response that raced in
// before the loss still wins.
func (c *conn) finishAfterConnLoss(t *task, out *ctlResult) error {
	<-c.readerDone // the reader no longer touches the task
	t.mu.Lock()
	completed, err := t.completed, t.takeResult(out)
	t.mu.Unlock()
	c.release(t)
	if completed {
		return err
	}
	return c.connErr()
}

// sendDataOut sends one Data-Out sequence [off, off+length) of the task's buffer in PDUs of at
// most the target's MaxRecvDataSegmentLength, DataSN from 0, F on the last (§11.7, §13.12).
func (c *conn) sendDataOut(t *task, ttt, off, length uint32) error {
	seg := c.params.TargetMaxRecvDataSegmentLength
	d := pdu.DataOut{LUN: t.lun, ITT: t.itt, TTT: ttt}
	for sent := uint32(0); sent < length; {
		// Queue up to len(t.dout) PDUs at once so that a burst leaves in one vectored write.
		c.sendMu.Lock()
		expStatSN := c.expStatSN.Load()
		outs := t.outs[:0]
		for i := 0; i < len(t.dout) && sent < length; i++ {
			n := min(seg, length-sent)
			d.Final = sent+n == length
			d.DataSegmentLength = int(n)
			d.BufferOffset = off + sent
			d.ExpStatSN = expStatSN
			d.Encode(&t.dout[i])
			outs = append(outs, transport.OutPDU{BHS: &t.dout[i], Data: t.buf[off+sent : off+sent+n], Lent: c.lendable(t)})
			d.DataSN++
			sent += n
		}
		err := c.submitManyLocked(outs, t.sent)
		clear(outs)
		if err != nil {
			return err
		}
	}
	return nil
}

// complete finishes a task from the reader: stores err, and either wakes the owner or, for an
// abandoned task, reaps the slot. Called with t.mu held; unlocks it.
func (c *conn) complete(t *task, err error) {
	t.completed = true
	t.err = err
	if t.abandoned {
		t.mu.Unlock()
		c.release(t)
		return
	}
	if done := t.async; done != nil {
		if err == nil && t.pipeErr != nil {
			err = t.pipeErr // GOOD, but the data did not all reach the pipe
		}
		// Submitted without an owner: the slot is free before the completer runs (the
		// response is in the caller's resp already), so the completer may submit again.
		t.async = nil
		t.mu.Unlock()
		c.release(t)
		c.completeAsync(done, err)
		return
	}
	t.mu.Unlock()
	select {
	case t.ev <- event{kind: evDone}:
	default:
		// Cannot happen: the final event always has room (capacity MaxOutstandingR2T+1 and the
		// reader never posts more R2Ts than that). Keep the owner from hanging regardless.
		go func() { t.ev <- event{kind: evDone} }()
	}
}
