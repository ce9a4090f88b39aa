package session

// The connection's reader: every PDU the target sends, dispatched by opcode (RFC 7143 §11):
// Data-In, SCSI Response, R2T, NOP-In, Reject, Async Message and the control responses.

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

// reader is the connection's only receiver.
func (c *conn) reader() {
	defer close(c.readerDone)
	var bhs pdu.BHS
	var err error
	for err == nil {
		if c.flushDue(pdu.BHSLen) {
			c.flushCompletions()
		}
		if _, err = c.tc.ReadHeader(&bhs); err != nil {
			break
		}
		if c.flushDue(pdu.Padded(bhs.DataSegmentLength())) { // a data digest, when negotiated, is 4 more: it comes with the PDU
			c.flushCompletions()
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
	c.flushCompletions()
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
		if bhs.Response() == 0 { // §11.15.1: closed successfully; the session is over
			c.loggedOut.Store(true)
		}
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
