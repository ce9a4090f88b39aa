package session

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
)

// Control tasks: NOP-Out ping, Text, Logout and Task Management. They are immediate commands
// (I bit): they carry the current CmdSN without advancing it and bypass the command window
// (RFC 7143 §3.2.2.1, §4.2.2.1).

// sendControl encodes (under the send lock, with the current CmdSN/ExpStatSN) and sends a
// control PDU for task t.
func (c *conn) sendControl(t *task, encode func(t *task, cmdSN, expStatSN uint32), data []byte) error {
	c.sendMu.Lock()
	t.tag.Store(t.itt) // publish the filled task to the reader (see task.tag)
	encode(t, c.cmdSN, c.expStatSN.Load())
	err := c.submitLocked(transport.OutPDU{BHS: &t.bhs, Data: data}, t.sent)
	if err != nil {
		c.shutdown(err)
	}
	return err
}

// control runs one request/response exchange on a fresh control task.
func (c *conn) control(ctx context.Context, kind uint8, ref uint32, encode func(t *task, cmdSN, expStatSN uint32), data []byte, out *ctlResult) error {
	t, err := c.acquire(ctx, kind)
	if err != nil {
		return err
	}
	t.ref = ref
	if err := c.sendControl(t, encode, data); err != nil {
		return c.finishAfterConnLoss(t, out)
	}
	return c.wait(ctx, t, out)
}

func (c *conn) ping(ctx context.Context, payload []byte) error {
	if len(payload) > int(c.params.TargetMaxRecvDataSegmentLength) {
		return fmt.Errorf("session: ping payload of %d bytes exceeds the target's MaxRecvDataSegmentLength %d",
			len(payload), c.params.TargetMaxRecvDataSegmentLength)
	}
	var out ctlResult
	err := c.control(ctx, kindNOP, 0, func(t *task, cmdSN, expStatSN uint32) {
		n := pdu.NOPOut{Immediate: true, DataSegmentLength: len(payload), ITT: t.itt, TTT: pdu.ReservedTag,
			CmdSN: cmdSN, ExpStatSN: expStatSN}
		n.Encode(&t.bhs)
	}, payload, &out)
	if err != nil {
		return err
	}
	// §11.19: the NOP-In answering a ping returns the ping data.
	if !bytes.Equal(out.data, payload) {
		return &ConnError{Target: c.s.cfg.TargetName, Portal: c.portal,
			Err: protoErr("NOP-In echoed %d bytes that differ from the %d-byte ping", len(out.data), len(payload))}
	}
	return nil
}

// text runs one Text Request/Response exchange (§11.10-11), sending empty continuation requests
// with the target's TTT while the target sets C (or clears F).
func (c *conn) text(ctx context.Context, kvs []login.KeyValue) ([]login.KeyValue, error) {
	req := login.EncodeText(nil, kvs)
	if len(req) > int(c.params.TargetMaxRecvDataSegmentLength) {
		return nil, fmt.Errorf("session: text request of %d bytes exceeds the target's MaxRecvDataSegmentLength", len(req))
	}
	t, err := c.acquire(ctx, kindText)
	if err != nil {
		return nil, err
	}
	var acc []byte
	ttt := uint32(pdu.ReservedTag)
	var out ctlResult
	for round := 0; ; round++ {
		if round > 4096 {
			c.shutdown(protoErr("text response longer than 4096 PDUs"))
			return nil, c.finishAfterConnLoss(t, nil)
		}
		data := req
		if round > 0 {
			data = nil
		}
		encode := func(t *task, cmdSN, expStatSN uint32) {
			r := pdu.TextRequest{Immediate: true, Final: true, DataSegmentLength: len(data), LUN: 0,
				ITT: t.itt, TTT: ttt, CmdSN: cmdSN, ExpStatSN: expStatSN}
			r.Encode(&t.bhs)
		}
		if err := c.sendControl(t, encode, data); err != nil {
			return nil, c.finishAfterConnLoss(t, nil)
		}
		// Wait for this round's response; keep the slot (and the ITT) for the next round.
		if err := c.waitRound(ctx, t, &out); err != nil {
			return nil, err
		}
		acc = append(acc, out.data...)
		if len(acc) > login.MaxTextLen {
			c.release(t)
			return nil, fmt.Errorf("session: text response exceeds %d bytes", login.MaxTextLen)
		}
		if out.bhs.Final() && !out.bhs.Continue() {
			c.release(t)
			break
		}
		ttt = out.bhs.TTT()
		if ttt == pdu.ReservedTag {
			c.release(t)
			c.shutdown(protoErr("continued text response with the reserved TTT"))
			return nil, c.connErr()
		}
	}
	res, err := login.DecodeTextMulti(acc)
	if err != nil {
		return nil, fmt.Errorf("session: text response: %w", err)
	}
	return res, nil
}

// waitRound waits for one response on a control task without releasing the slot.
func (c *conn) waitRound(ctx context.Context, t *task, out *ctlResult) error {
	select {
	case <-t.ev:
		t.mu.Lock()
		err := t.takeResult(out)
		t.completed = false
		t.mu.Unlock()
		if err != nil {
			c.release(t)
		}
		return err
	case <-ctx.Done():
		t.mu.Lock()
		if t.completed {
			err := t.takeResult(out)
			t.completed = false
			t.mu.Unlock()
			if err != nil {
				c.release(t)
			}
			return err
		}
		t.abandoned = true
		t.mu.Unlock()
		return ctx.Err()
	case <-c.done:
		return c.finishAfterConnLoss(t, nil)
	}
}

// logout sends Logout Request "close the session" and waits for the response (§11.14-15).
func (c *conn) logout(ctx context.Context) error {
	c.closing.Store(true)
	var out ctlResult
	err := c.control(ctx, kindLogout, 0, func(t *task, cmdSN, expStatSN uint32) {
		l := pdu.LogoutRequest{Immediate: true, Reason: pdu.LogoutCloseSession, ITT: t.itt, CID: c.params.CID,
			CmdSN: cmdSN, ExpStatSN: expStatSN}
		l.Encode(&t.bhs)
	}, nil, &out)
	if err != nil {
		return fmt.Errorf("iSCSI logout from %s: %w", c.s.cfg.TargetName, err)
	}
	if r := out.bhs.Response(); r != 0 {
		return fmt.Errorf("iSCSI logout from %s: target answered %d (%s)", c.s.cfg.TargetName, r, logoutResponse(r))
	}
	c.log.Info("iSCSI logout complete")
	return nil
}

func logoutResponse(r uint8) string {
	switch r {
	case 0:
		return "connection or session closed successfully"
	case 1:
		return "CID not found"
	case 2:
		return "connection recovery is not supported"
	case 3:
		return "cleanup failed for various reasons"
	}
	return "unknown"
}

// abort sends ABORT TASK for an abandoned task (§11.5.1). When the target answers "function
// complete" or "task does not exist", no further PDU for that task can come (§11.6.1: the target
// sends no response for a covered task after the TMF response), so its slot is reaped.
func (c *conn) abort(lun uint64, itt, cmdSN uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out ctlResult
	err := c.control(ctx, kindTMF, itt, func(t *task, curCmdSN, expStatSN uint32) {
		r := pdu.TaskMgmtRequest{Immediate: true, Function: pdu.TMFAbortTask, LUN: lun, ITT: t.itt,
			RefTaskTag: itt, CmdSN: curCmdSN, ExpStatSN: expStatSN, RefCmdSN: cmdSN, ExpDataSN: 0}
		r.Encode(&t.bhs)
	}, nil, &out)
	if err != nil {
		c.log.Debug("iSCSI ABORT TASK did not complete", zap.Uint32("itt", itt), zap.Error(err))
		return
	}
	c.log.Debug("iSCSI ABORT TASK answered", zap.Uint32("itt", itt), zap.Uint8("response", out.bhs.Response()))
}

// reapAborted frees the task a TMF response refers to (called by the reader with tmf.mu held).
func (c *conn) reapAborted(tmf *task) {
	if r := tmf.ctlBHS.Response(); r != 0 && r != 1 {
		return // function rejected etc.: the task lives on
	}
	if tmf.endLive && tmf.tmfFn == pdu.TMFLogicalUnitReset {
		c.endLUNTasks(tmf) // tmf.go
		return
	}
	t := c.lookup(tmf.ref)
	if t == nil || t == tmf {
		return
	}
	t.mu.Lock()
	if t.active && t.abandoned && !t.completed {
		t.completed = true
		t.mu.Unlock()
		c.release(t)
		return
	}
	if tmf.endLive && t.active && !t.completed && t.kind == kindSCSI {
		c.complete(t, abortedError(pdu.TMFAbortTask)) // unlocks t.mu
		return
	}
	t.mu.Unlock()
}

func timeSeconds(n uint16) time.Duration {
	if n == 0 {
		return 5 * time.Second
	}
	return time.Duration(n) * time.Second
}
