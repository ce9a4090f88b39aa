package session

import (
	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

// Completer receives the end of a command started with Session.Submit.
type Completer interface {
	// Complete is called exactly once, on the connection's reader goroutine (or, rarely, the
	// goroutine that ends the connection), after the command's response filled resp, or with
	// the error that ended it (a *ConnError when the connection was lost, a *TaskError when the
	// target rejected or aborted it). It must not block: the reader waits for it.
	Complete(err error)
}

// Submit starts cmd without waiting for its completion and without a goroutine of its own: the
// reader routes the response to done. It starts the command only when nothing would make it
// wait: a task slot is free, the CmdSN window is open (RFC 7143 §4.2.2.1), the connection is up,
// and a write needs no PDU of ours after the command (see asyncWriteMax). Otherwise it returns
// false having sent nothing, and the caller uses Execute.
//
// The command PDU is queued, not written: it leaves with the next batch any sender writes, or
// when the caller calls Kick. Callers submitting several commands in a row call Kick once
// after the last, so they all go out in one vectored write. cmd.Data and resp must stay untouched
// until done is called; no context applies (the connection's end, a keepalive failure or ABORT
// TASK from the command watchdog end a submitted command like any other).
func (s *Session) Submit(cmd *scsi.Command, resp *scsi.Response, done Completer) bool {
	c := s.cur.Load()
	if c == nil || s.cfg.Discovery {
		return false
	}
	return c.submit(cmd, resp, done, -1, 0)
}

// SubmitWriteMax is the largest write Submit takes on the current connection (see
// asyncWriteMax); 0 when there is none.
func (s *Session) SubmitWriteMax() int {
	c := s.cur.Load()
	if c == nil || s.cfg.Discovery {
		return 0
	}
	return c.writeMax
}

// maxSubmitLength bounds a submitted command's transfer.
const maxSubmitLength = 1 << 24

// submitLengthMax is the largest transfer submit takes on c (kept in c.submitMax: the transport
// and the parameters are the connection's for life, so neither limit is worked out per command): maxSubmitLength, or less where the
// transport caps one command's data (iSER's MaxTransferLength, see MaxCommandData), since a
// command over that cap fails the connection when it is sent rather than being declined.
func (c *conn) submitLengthMax() int {
	if l, ok := c.tc.(interface{ MaxTransferLength() int }); ok {
		return min(maxSubmitLength, l.MaxTransferLength())
	}
	return maxSubmitLength
}

// asyncWriteMax is the largest write submit takes on c: one that needs no PDU of ours after the
// command, since Data-Out PDUs and answers to R2Ts need Execute's task.
//   - Over TCP, the data must all go as immediate data (RFC 7143 §13.11, §13.14: ImmediateData=Yes,
//     up to FirstBurstLength and the target's MaxRecvDataSegmentLength): anything more is sent
//     as unsolicited Data-Out PDUs or solicited by R2T.
//   - Over iSER the target fetches solicited data itself by RDMA Read (RFC 7145 §7.3.2), so only
//     unsolicited Data-Out PDUs stand in the way (InitialR2T=No with more unsolicited data than
//     immediate data fits, §13.10): any write up to the transport's cap is taken otherwise. Our
//     iSER login proposes InitialR2T=Yes (and the result is the OR of both sides), so against a
//     real target that is every write.
func (c *conn) asyncWriteMax() int {
	unsolicited, immediate := c.params.UnsolicitedLimit(maxSubmitLength)
	if c.tc.MovesData() && unsolicited == immediate {
		return c.submitLengthMax()
	}
	return min(immediate, c.submitLengthMax())
}

// direct reports whether the transport can send a command for buf without waiting for memory of
// its own: always over TCP; over iSER when buf is registered (transport.DirectMemory), since a
// bounce buffer may have to wait for the pool.
func (c *conn) direct(buf []byte) bool {
	if !c.tc.MovesData() || len(buf) == 0 {
		return true
	}
	d, ok := c.tc.(transport.DirectMemory)
	return ok && d.Direct(buf)
}

// SubmitToPipe is Submit for a read whose n bytes of data are to land in a pipe instead of
// cmd.Data (which must be nil): the reader splices each Data-In segment from the socket into the
// pipe whose write end is pipeW (non-blocking, room for n bytes; nobody else may write to or read
// from it until done is called), so the bytes never pass through user memory
// (transport.PipeReader). It declines (false) where that cannot work: a transport without
// PipeReader or with a data digest, and DataPDUInOrder=No or DataSequenceInOrder=No (the pipe is
// a stream; Data-In must arrive in offset order, §13.19, §13.20).
//
// done gets what Submit's would, with one addition: a GOOD status whose data did not all fit in
// the pipe completes with transport.ErrPipeFull (the connection is fine). The pipe then holds an
// unspecified part of the data, as it does after any error, a non-GOOD status or a residual.
func (s *Session) SubmitToPipe(cmd *scsi.Command, n, pipeW int, resp *scsi.Response, done Completer) bool {
	c := s.cur.Load()
	if c == nil || s.cfg.Discovery || cmd.Dir != scsi.DirRead || cmd.Data != nil || n <= 0 || pipeW < 0 {
		return false
	}
	if !c.params.DataPDUInOrder || !c.params.DataSequenceInOrder {
		return false
	}
	if pr, ok := c.tc.(transport.PipeReader); !ok || !pr.CanReadToPipe() {
		return false
	}
	return c.submit(cmd, resp, done, pipeW, n)
}

// Kick writes the commands Submit queued (see Submit).
func (s *Session) Kick() {
	if c := s.cur.Load(); c != nil {
		c.kick()
	}
}

// tryAcquire is acquire without waiting.
func (c *conn) tryAcquire() *task {
	var idx uint32
	select {
	case idx = <-c.free:
	default:
		return nil
	}
	return c.claim(idx, kindSCSI)
}

// submit starts cmd; with pipeW >= 0 its pipeLen bytes of Data-In go to that pipe (SubmitToPipe).
func (c *conn) submit(cmd *scsi.Command, resp *scsi.Response, done Completer, pipeW, pipeLen int) bool {
	length := len(cmd.Data)
	if pipeW >= 0 {
		length = pipeLen
	}
	if cmd.CDBLen == 0 || cmd.CDBLen > 16 || length > c.submitMax || !c.direct(cmd.Data) {
		return false
	}
	var unsolicited, immediate int
	if cmd.Dir == scsi.DirWrite {
		if len(cmd.Data) > c.writeMax {
			return false // Data-Out PDUs to send, or an R2T to answer: Execute's task does that
		}
		unsolicited, immediate = c.params.UnsolicitedLimit(len(cmd.Data))
	}
	if c.dead() {
		return false
	}
	t := c.tryAcquire()
	if t == nil {
		return false
	}
	t.lun, t.dir, t.buf, t.resp = cmd.LUN, cmd.Dir, cmd.Data, resp
	if pipeW >= 0 {
		t.pipeW, t.pipeLen = pipeW, pipeLen
	}
	*resp = scsi.Response{}
	t.xfer = transport.Task{ITT: t.itt, Dir: cmd.Dir, Buf: cmd.Data, Unsolicited: unsolicited, Immediate: immediate}
	attr := uint8(cmd.Attr)
	if attr == uint8(scsi.AttrUntagged) {
		attr = uint8(scsi.AttrSimple)
	}
	sc := pdu.SCSICommand{
		Final:                      true,
		Read:                       cmd.Dir == scsi.DirRead,
		Write:                      cmd.Dir == scsi.DirWrite,
		Attr:                       attr,
		DataSegmentLength:          immediate,
		LUN:                        cmd.LUN,
		ITT:                        t.itt,
		ExpectedDataTransferLength: uint32(length),
		CDB:                        cmd.CDB[:cmd.CDBLen],
	}
	c.sendMu.Lock()
	// A full window, or one that commands of Execute wait for: Submit never waits, nor overtakes
	// them (they would wait as long as newcomers kept taking the slots that open).
	if !serialLE(c.cmdSN, c.maxCmdSN.Load()) || c.windowWaiters() {
		c.sendMu.Unlock()
		c.release(t)
		return false
	}
	// From here the command is committed. t.async is set under t.mu with the connection seen
	// alive: the reader's final sweep (after c.done is closed) then finds the task if no
	// response ever comes, so done is called exactly once either way.
	t.mu.Lock()
	if c.dead() {
		t.mu.Unlock()
		c.sendMu.Unlock()
		c.release(t)
		return false
	}
	t.async = done
	t.mu.Unlock()
	sc.CmdSN, sc.ExpStatSN = c.cmdSN, c.expStatSN.Load()
	t.cmdSN = c.cmdSN
	t.tag.Store(t.itt) // from here on the reader may route PDUs to the task
	c.cmdSN++
	sc.Encode(&t.bhs)
	c.queue = append(c.queue, queued{out: transport.OutPDU{BHS: &t.bhs, Data: t.xfer.Buf[:immediate], Task: &t.xfer}})
	c.sendMu.Unlock()
	return true
}
