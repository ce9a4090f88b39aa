package session

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
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
	ev   chan event // R2Ts and the final completion; capacity MaxOutstandingR2T+1
	sent chan error // write results when another sender flushed this task's PDU

	// Set by the owner before the command is sent, read-only afterwards.
	lun  uint64
	dir  scsi.Direction
	buf  []byte
	resp *scsi.Response
	// A read started by SubmitToPipe: its Data-In lands in the pipe whose write end is pipeW
	// (>= 0, see toPipe), pipeLen bytes in all, instead of buf (nil).
	pipeW   int
	pipeLen int
	xfer    transport.Task
	bhs     pdu.BHS // the owner's send scratch
	dout    [16]pdu.BHS
	outs    []transport.OutPDU // scratch for dout, capacity len(dout)

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
	winCh      chan struct{} // closed when MaxCmdSN advances; nil when nobody waits
	winWaiters atomic.Int32  // commands waiting for the window

	expStatSN atomic.Uint32

	closing    atomic.Bool // a logout is in progress: the target closing the socket is expected
	done       chan struct{}
	doneOnce   sync.Once
	err        error
	readerDone chan struct{}

	respBuf []byte // reader scratch for response data segments
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
		respBuf:    make([]byte, p.MaxRecvDataSegmentLength),
	}
	c.expCmdSN.Store(p.ExpCmdSN)
	c.maxCmdSN.Store(p.MaxCmdSN)
	c.expStatSN.Store(p.StatSN + 1)
	evCap := int(min(p.MaxOutstandingR2T, maxOutstandingR2T)) + 1
	for i := range c.tasks {
		t := &c.tasks[i]
		t.idx, t.gen, t.pipeW = uint32(i), 1, -1
		t.ev = make(chan event, evCap)
		t.sent = make(chan error, 1)
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
// makes the reader exit; the reader then reaps abandoned tasks.
func (c *conn) shutdown(err error) {
	c.doneOnce.Do(func() {
		c.err = err
		close(c.done)
		c.tc.Close()
	})
}

func (c *conn) connErr() error {
	return &ConnError{Target: c.s.cfg.TargetName, Portal: c.portal, Err: c.err}
}

// acquire takes a free slot, waiting while all are busy.
func (c *conn) acquire(ctx context.Context, kind uint8) (*task, error) {
	free := c.free
	if kind != kindSCSI {
		free = c.ctlFree
	}
	var idx uint32
	select {
	case idx = <-free:
	default:
		select {
		case idx = <-free:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.done:
			return nil, c.connErr()
		}
	}
	return c.claim(idx, kind), nil
}

// claim readies the free slot idx for a new task of kind (a fresh ITT generation, no state from
// the slot's previous task).
func (c *conn) claim(idx uint32, kind uint8) *task {
	t := &c.tasks[idx]
	t.mu.Lock()
	t.active, t.abandoned, t.completed, t.err = true, false, false, nil
	t.itt = t.gen<<16 | t.idx
	t.kind = kind
	t.dataSN, t.received, t.r2tSN = 0, 0, 0
	t.tmfFn, t.endLive = 0, false
	t.pipeW, t.pipeLen, t.pipeErr = -1, 0, nil
	t.mu.Unlock()
	return t
}

// release returns a slot to the free list. Called exactly once per acquire: by the owner, or by
// the reader for an abandoned task.
func (c *conn) release(t *task) {
	t.tag.Store(0)
	if t.kind == kindSCSI {
		c.tc.TaskDone(t.itt)
	}
	t.mu.Lock()
	t.active = false
	t.buf, t.resp = nil, nil
	t.pipeW, t.pipeErr = -1, nil
	t.gen = (t.gen + 1) & 0xffff
	if t.gen == 0 {
		t.gen = 1
	}
	t.mu.Unlock()
	for {
		select {
		case <-t.ev: // drain stale events
			continue
		default:
		}
		break
	}
	if t.idx < c.nSCSI {
		c.free <- t.idx
	} else {
		c.ctlFree <- t.idx
	}
}

// lookup maps an ITT to its active task.
func (c *conn) lookup(itt uint32) *task {
	idx := itt & 0xffff
	if itt == pdu.ReservedTag || int(idx) >= len(c.tasks) {
		return nil
	}
	t := &c.tasks[idx]
	if t.tag.Load() != itt {
		return nil
	}
	return t
}

// waitWindow blocks until CmdSN may be sent (CmdSN <= MaxCmdSN, §4.2.2.1); it returns with
// sendMu held on success.
func (c *conn) waitWindow(ctx context.Context) error {
	for {
		c.sendMu.Lock()
		if serialLE(c.cmdSN, c.maxCmdSN.Load()) {
			return nil
		}
		cmdSN := c.cmdSN
		c.sendMu.Unlock()
		c.winMu.Lock()
		c.winWaiters.Add(1)
		if serialLE(cmdSN, c.maxCmdSN.Load()) {
			c.winWaiters.Add(-1)
			c.winMu.Unlock()
			continue
		}
		if c.winCh == nil {
			c.winCh = make(chan struct{})
		}
		ch := c.winCh
		c.winMu.Unlock()
		var err error
		select {
		case <-ch:
		case <-ctx.Done():
			err = ctx.Err()
		case <-c.done:
			err = c.connErr()
		}
		c.winWaiters.Add(-1)
		if err != nil {
			return err
		}
	}
}

// updateWindow applies ExpCmdSN/MaxCmdSN from a target PDU (§4.2.2.1): ignored when MaxCmdSN <
// ExpCmdSN-1, and never moved backwards.
func (c *conn) updateWindow(bhs *pdu.BHS) {
	exp, maxSN := bhs.ExpCmdSN(), bhs.MaxCmdSN()
	if serialLT(maxSN, exp-1) {
		return
	}
	if serialGT(exp, c.expCmdSN.Load()) {
		c.expCmdSN.Store(exp)
	}
	if serialGT(maxSN, c.maxCmdSN.Load()) {
		// The reader is the only writer of maxCmdSN. Waiters register (winWaiters) before they
		// re-check maxCmdSN, so either they see the new value or we see them: the lock is taken
		// only when someone waits.
		c.maxCmdSN.Store(maxSN)
		if c.winWaiters.Load() > 0 {
			c.winMu.Lock()
			if c.winCh != nil {
				close(c.winCh)
				c.winCh = nil
			}
			c.winMu.Unlock()
		}
	}
}

// updateStatSN advances ExpStatSN past a status-carrying PDU (§4.2.2.2).
func (c *conn) updateStatSN(statSN uint32) {
	if next := statSN + 1; serialGT(next, c.expStatSN.Load()) {
		c.expStatSN.Store(next)
	}
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
	if err := c.waitWindow(ctx); err != nil {
		c.release(t)
		return err
	}
	sc.CmdSN, sc.ExpStatSN = c.cmdSN, c.expStatSN.Load()
	t.cmdSN = c.cmdSN
	t.tag.Store(t.itt) // from here on the reader may route PDUs to the task
	c.cmdSN++
	sc.Encode(&t.bhs)
	err = c.submitLocked(transport.OutPDU{BHS: &t.bhs, Data: t.xfer.Buf[:t.xfer.Immediate], Task: &t.xfer}, t.sent)
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
	for {
		select {
		case ev := <-t.ev:
			switch ev.kind {
			case evR2T:
				if err := c.sendDataOut(t, ev.ttt, ev.off, ev.length); err != nil {
					c.shutdown(err)
					return c.finishAfterConnLoss(t, nil)
				}
			case evDone:
				t.mu.Lock()
				err := t.takeResult(out)
				t.mu.Unlock()
				c.release(t)
				return err
			}
		case <-ctx.Done():
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
			return c.finishAfterConnLoss(t, out)
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
			outs = append(outs, transport.OutPDU{BHS: &t.dout[i], Data: t.buf[off+sent : off+sent+n]})
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
		done.Complete(err)
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

// reader is the connection's only receiver.
func (c *conn) reader() {
	defer close(c.readerDone)
	var bhs pdu.BHS
	var err error
	for err == nil {
		if _, err = c.tc.ReadHeader(&bhs); err != nil {
			break
		}
		err = c.dispatch(&bhs)
	}
	if !c.dead() && !c.closing.Load() {
		c.log.Warn("iSCSI connection failed", zap.Error(err))
	}
	c.shutdown(err)
	// Reap abandoned tasks and fail submitted ones (they have no owner to see c.done); owners of
	// the others see c.done.
	for i := range c.tasks {
		t := &c.tasks[i]
		t.mu.Lock()
		if t.active && t.abandoned && !t.completed {
			t.completed = true
			t.mu.Unlock()
			c.release(t)
			continue
		}
		if t.active && t.async != nil && !t.completed {
			c.complete(t, c.connErr()) // unlocks t.mu
			continue
		}
		t.mu.Unlock()
	}
}

func (c *conn) dispatch(bhs *pdu.BHS) error {
	op := bhs.Opcode()
	switch op {
	case pdu.OpDataIn:
		c.updateWindow(bhs)
		if bhs.Flags()&pdu.FlagStatus != 0 {
			c.updateStatSN(bhs.StatSN())
		}
		return c.dataIn(bhs)
	case pdu.OpSCSIResponse:
		c.updateWindow(bhs)
		c.updateStatSN(bhs.StatSN())
		return c.scsiResponse(bhs)
	case pdu.OpR2T:
		c.updateWindow(bhs)
		return c.r2t(bhs)
	case pdu.OpNOPIn:
		c.updateWindow(bhs)
		if bhs.ITT() != pdu.ReservedTag {
			c.updateStatSN(bhs.StatSN())
		}
		return c.nopIn(bhs)
	case pdu.OpReject:
		c.updateWindow(bhs)
		c.updateStatSN(bhs.StatSN())
		return c.reject(bhs)
	case pdu.OpAsyncMessage:
		c.updateWindow(bhs)
		c.updateStatSN(bhs.StatSN())
		return c.asyncMessage(bhs)
	case pdu.OpTextResp, pdu.OpLogoutResp, pdu.OpTaskMgmtResp:
		c.updateWindow(bhs)
		c.updateStatSN(bhs.StatSN())
		return c.controlResponse(bhs)
	default:
		return protoErr("unexpected %v in the full-feature phase", op)
	}
}

func (c *conn) dataIn(bhs *pdu.BHS) error {
	itt := bhs.ITT()
	t := c.lookup(itt)
	if t == nil || t.kind != kindSCSI {
		return protoErr("Data-In for unknown ITT 0x%08x", itt)
	}
	n := bhs.DataSegmentLength()
	off := int64(bhs.BufferOffset())
	t.mu.Lock()
	if t.dir != scsi.DirRead {
		t.mu.Unlock()
		return protoErr("Data-In for ITT 0x%08x, which is not a read", itt)
	}
	if bhs.DataSN() != t.dataSN {
		t.mu.Unlock()
		return protoErr("Data-In DataSN %d for ITT 0x%08x, expected %d", bhs.DataSN(), itt, t.dataSN)
	}
	size := len(t.buf)
	if t.toPipe() {
		size = t.pipeLen
	}
	if off+int64(n) > int64(size) {
		t.mu.Unlock()
		return protoErr("Data-In [%d, +%d) beyond the %d-byte buffer of ITT 0x%08x", off, n, size, itt)
	}
	if (c.params.DataPDUInOrder || t.toPipe()) && off != int64(t.received) {
		t.mu.Unlock()
		return protoErr("Data-In at offset %d for ITT 0x%08x, expected %d (DataPDUInOrder=Yes)", off, itt, t.received)
	}
	t.dataSN++
	var err error
	if n > 0 {
		switch {
		case t.abandoned || t.pipeErr != nil:
			err = c.tc.DiscardData()
		case t.toPipe():
			// Spliced from the socket into the caller's pipe (submit.go). A full pipe
			// costs this task its fast path, not the connection: the transport consumed
			// the segment, and the task completes with the error.
			err = c.tc.(transport.PipeReader).ReadDataToPipe(t.pipeW)
			if errors.Is(err, transport.ErrPipeFull) {
				t.pipeErr, err = err, nil
			}
		default:
			// Straight from the transport into the caller's buffer; t.mu keeps the owner from
			// returning (and the buffer from being reused) while the bytes land.
			err = c.tc.ReadData(t.buf[off : off+int64(n)])
		}
	}
	if err != nil {
		t.mu.Unlock()
		return err
	}
	t.received += n
	if bhs.Flags()&pdu.FlagStatus == 0 {
		t.mu.Unlock()
		return nil
	}
	// Data-In with status (§11.7.3): the task is complete.
	if !t.abandoned {
		t.resp.Status = scsi.Status(bhs.Status())
		t.resp.Residual = residual(bhs)
	}
	c.complete(t, nil)
	return nil
}

func residual(bhs *pdu.BHS) int64 {
	switch f := bhs.Flags(); {
	case f&pdu.FlagUnderflow != 0:
		return int64(bhs.ResidualCount())
	case f&pdu.FlagOverflow != 0:
		return -int64(bhs.ResidualCount())
	}
	return 0
}

func (c *conn) readResponseData(bhs *pdu.BHS) ([]byte, error) {
	n := bhs.DataSegmentLength()
	if n == 0 {
		return nil, nil
	}
	if n > len(c.respBuf) {
		return nil, protoErr("%v with a %d-byte data segment", bhs.Opcode(), n)
	}
	buf := c.respBuf[:n]
	return buf, c.tc.ReadData(buf)
}

func (c *conn) scsiResponse(bhs *pdu.BHS) error {
	data, err := c.readResponseData(bhs)
	if err != nil {
		return err
	}
	itt := bhs.ITT()
	t := c.lookup(itt)
	if t == nil || t.kind != kindSCSI {
		return protoErr("SCSI Response for unknown ITT 0x%08x", itt)
	}
	sense, serr := pdu.SenseData(data)
	if serr != nil {
		return protoErr("SCSI Response for ITT 0x%08x: %v", itt, serr)
	}
	t.mu.Lock()
	var taskErr error
	if r := bhs.Response(); r != 0 {
		// §11.4.3: 0x01 target failure; the status is not valid.
		taskErr = &TaskError{Reason: fmt.Sprintf("iSCSI response 0x%02x (target failure) for ITT 0x%08x", r, itt)}
	} else if !t.abandoned {
		t.resp.Status = scsi.Status(bhs.Status())
		t.resp.Residual = residual(bhs)
		t.resp.SenseLen = uint8(copy(t.resp.Sense[:], sense))
	}
	c.complete(t, taskErr)
	return nil
}

func (c *conn) r2t(bhs *pdu.BHS) error {
	itt := bhs.ITT()
	t := c.lookup(itt)
	if t == nil || t.kind != kindSCSI {
		return protoErr("R2T for unknown ITT 0x%08x", itt)
	}
	if c.tc.MovesData() {
		return protoErr("R2T for ITT 0x%08x on a transport that moves data itself", itt)
	}
	off, length := bhs.BufferOffset(), bhs.DesiredDataTransferLength()
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.dir != scsi.DirWrite:
		return protoErr("R2T for ITT 0x%08x, which is not a write", itt)
	case bhs.DataSN() != t.r2tSN:
		return protoErr("R2TSN %d for ITT 0x%08x, expected %d", bhs.DataSN(), itt, t.r2tSN)
	case uint64(off)+uint64(length) > uint64(len(t.buf)):
		return protoErr("R2T [%d, +%d) beyond the %d-byte buffer of ITT 0x%08x", off, length, len(t.buf), itt)
	case length > c.params.MaxBurstLength:
		return protoErr("R2T for %d bytes exceeds MaxBurstLength %d", length, c.params.MaxBurstLength)
	case bhs.TTT() == pdu.ReservedTag:
		return protoErr("R2T with the reserved TTT")
	}
	if t.async != nil {
		// Submit sends only commands whose data is all immediate: nothing is left to solicit.
		return protoErr("R2T for ITT 0x%08x, whose data was all sent with the command", itt)
	}
	t.r2tSN++
	if t.abandoned {
		// The caller's buffer is gone: we cannot send this data. The ABORT TASK sent when the
		// task was abandoned ends the task on the target (§11.5.1).
		return nil
	}
	select {
	case t.ev <- event{kind: evR2T, ttt: bhs.TTT(), off: off, length: length}:
		return nil
	default:
		return protoErr("more than MaxOutstandingR2T=%d R2Ts outstanding for ITT 0x%08x", c.params.MaxOutstandingR2T, itt)
	}
}

func (c *conn) nopIn(bhs *pdu.BHS) error {
	data, err := c.readResponseData(bhs)
	if err != nil {
		return err
	}
	if bhs.ITT() != pdu.ReservedTag {
		// The answer to our ping.
		return c.deliverControl(bhs, data, kindNOP)
	}
	if bhs.TTT() == pdu.ReservedTag {
		return nil // an unsolicited NOP-In that wants no answer (§11.19.1)
	}
	// The target pings us: answer with a NOP-Out echoing TTT, LUN and data (§11.18.2-3), from
	// another goroutine so that the reader never blocks on a write.
	echo := bytes.Clone(data)
	lun, ttt := bhs.LUN(), bhs.TTT()
	go func() {
		var out pdu.BHS
		c.sendMu.Lock()
		n := pdu.NOPOut{Immediate: true, DataSegmentLength: len(echo), LUN: lun, ITT: pdu.ReservedTag, TTT: ttt,
			CmdSN: c.cmdSN, ExpStatSN: c.expStatSN.Load()}
		n.Encode(&out)
		err := c.submitLocked(transport.OutPDU{BHS: &out, Data: echo}, make(chan error, 1))
		if err != nil {
			c.shutdown(err)
		}
	}()
	return nil
}

func (c *conn) reject(bhs *pdu.BHS) error {
	data, err := c.readResponseData(bhs)
	if err != nil {
		return err
	}
	var rejected pdu.BHS
	copy(rejected[:], data)
	reason := bhs.RejectReason()
	itt := rejected.ITT()
	c.log.Warn("iSCSI target rejected a PDU", zap.Uint8("reason", reason), zap.String("reason_text", rejectReason(reason)),
		zap.Stringer("rejected_opcode", rejected.Opcode()), zap.Uint32("itt", itt))
	t := c.lookup(itt)
	if t == nil {
		if reason == 0x09 || reason == 0x04 { // invalid PDU field / protocol error: nothing to fail
			return nil
		}
		return nil
	}
	t.mu.Lock()
	terr := &TaskError{Reason: fmt.Sprintf("target rejected the %v PDU: %s (reason 0x%02x)", rejected.Opcode(), rejectReason(reason), reason)}
	// §11.17.1: after a Reject of a command (CmdSN consumed, no response coming) the task is
	// over; at ERL 0 a rejected Data-Out also ends the task (the target then sends a response
	// or nothing). In both cases the ITT is free again only once the target says so: a
	// Reject with reason "data digest error"/"protocol error" for a Data-Out might still be
	// followed by a response, so we only finish tasks whose command itself was rejected.
	if rejected.Opcode() == pdu.OpDataOut || rejected.Opcode() == pdu.OpSNACKReq {
		t.mu.Unlock()
		return protoErr("target rejected a %v for ITT 0x%08x (reason 0x%02x)", rejected.Opcode(), itt, reason)
	}
	c.complete(t, terr)
	return nil
}

func rejectReason(r uint8) string {
	switch r {
	case 0x02:
		return "data (payload) digest error"
	case 0x03:
		return "SNACK reject"
	case 0x04:
		return "protocol error"
	case 0x05:
		return "command not supported"
	case 0x06:
		return "immediate command reject (too many immediate commands)"
	case 0x07:
		return "task in progress"
	case 0x08:
		return "invalid data ack"
	case 0x09:
		return "invalid PDU field"
	case 0x0a:
		return "long operation reject (out of resources)"
	case 0x0b:
		return "deprecated"
	case 0x0c:
		return "waiting for logout"
	}
	return "unknown reason"
}

func (c *conn) asyncMessage(bhs *pdu.BHS) error {
	data, err := c.readResponseData(bhs)
	if err != nil {
		return err
	}
	event, vcode, p1, p2, p3 := bhs.AsyncEvent()
	log := c.log.With(zap.Uint8("event", event), zap.Uint8("vcode", vcode),
		zap.Uint16("param1", p1), zap.Uint16("param2", p2), zap.Uint16("param3", p3))
	switch event {
	case 0: // SCSI asynchronous event: sense data in the segment (§11.9.1)
		sense, _ := pdu.SenseData(data)
		log.Info("iSCSI target reported a SCSI asynchronous event", zap.Binary("sense", sense))
	case 1: // target requests logout within Parameter3 seconds
		log.Warn("iSCSI target requests logout")
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeSeconds(p3))
			defer cancel()
			if err := c.logout(ctx); err != nil {
				c.log.Warn("iSCSI logout requested by the target failed", zap.Error(err))
			}
			c.shutdown(errors.New("target requested logout"))
		}()
	case 2: // the target will drop this connection (Parameter2/3: Time2Wait/Time2Retain)
		log.Warn("iSCSI target will drop the connection")
		c.closing.Store(true) // the coming EOF is announced, not a failure to warn about again
	case 3: // the target will drop all connections of the session
		log.Warn("iSCSI target will drop all connections of the session")
		c.closing.Store(true)
	case 4: // the target requests parameter renegotiation
		log.Info("iSCSI target requests parameter negotiation; keeping the current parameters")
	default:
		log.Info("iSCSI asynchronous message")
	}
	return nil
}

// controlResponse routes a Text, Logout or TMF response to the waiting control task.
func (c *conn) controlResponse(bhs *pdu.BHS) error {
	data, err := c.readResponseData(bhs)
	if err != nil {
		return err
	}
	kind := kindText
	switch bhs.Opcode() {
	case pdu.OpLogoutResp:
		kind = kindLogout
	case pdu.OpTaskMgmtResp:
		kind = kindTMF
	}
	return c.deliverControl(bhs, data, kind)
}

func (c *conn) deliverControl(bhs *pdu.BHS, data []byte, kind uint8) error {
	itt := bhs.ITT()
	t := c.lookup(itt)
	if t == nil || t.kind != kind {
		return protoErr("%v for unknown ITT 0x%08x", bhs.Opcode(), itt)
	}
	t.mu.Lock()
	t.ctlBHS = *bhs
	t.ctlData = append(t.ctlData[:0], data...)
	if kind == kindTMF {
		// An ABORT TASK answered: the aborted task's ITT is free again (§11.6.1).
		c.reapAborted(t)
	}
	c.complete(t, nil)
	return nil
}
