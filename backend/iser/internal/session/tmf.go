package session

// Task management for stuck commands (RFC 7143 §11.5, SAM-5 §7): the device layer's command
// watchdog escalates ABORT TASK (AbortOutstanding) → LOGICAL UNIT RESET (ResetLUN) → dropping
// the connection (Drop). A task the target confirms ended fails with ErrTaskAborted, so its
// command can be re-issued; after the TMF response the target sends nothing more for it
// (§4.2.3.3, §11.6.1), which is what makes freeing its ITT safe.

import (
	"context"
	"errors"
	"fmt"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
)

// ErrTaskAborted is the cause of a task ended by a task management function this initiator sent
// (the command made no progress). The command never completed and may be re-issued.
var ErrTaskAborted = errors.New("iSCSI task aborted by task management")

func abortedError(fn uint8) error {
	name := "ABORT TASK"
	if fn == pdu.TMFLogicalUnitReset {
		name = "LOGICAL UNIT RESET"
	}
	return &TaskError{Reason: fmt.Sprintf("ended by %s", name), Err: ErrTaskAborted}
}

// stuckTask identifies one outstanding SCSI task.
type stuckTask struct {
	lun        uint64
	itt, cmdSN uint32
}

// AbortOutstanding sends ABORT TASK for every SCSI command outstanding on the current connection
// and returns how many the target confirmed ended ("function complete" or "task does not
// exist"); those fail with ErrTaskAborted. It returns an error if any ABORT TASK went unanswered
// or was refused (then the caller escalates).
func (s *Session) AbortOutstanding(ctx context.Context) (int, error) {
	c := s.cur.Load()
	if c == nil || c.dead() {
		return 0, &ConnError{Target: s.cfg.TargetName, Portal: s.portal, Err: ErrNotLoggedIn}
	}
	var stuck []stuckTask
	for i := range c.tasks[:c.nSCSI] {
		t := &c.tasks[i]
		t.mu.Lock()
		if t.active && !t.completed && !t.abandoned && t.tag.Load() != 0 {
			stuck = append(stuck, stuckTask{lun: t.lun, itt: t.itt, cmdSN: t.cmdSN})
		}
		t.mu.Unlock()
	}
	aborted := 0
	var errs []error
	for _, st := range stuck {
		resp, err := c.tmf(ctx, pdu.TMFAbortTask, st.lun, st.itt, st.cmdSN)
		switch {
		case err != nil:
			errs = append(errs, err)
		case resp == 0 || resp == 1:
			aborted++
		default:
			errs = append(errs, fmt.Errorf("ABORT TASK of ITT 0x%08x: target answered %d (%s)", st.itt, resp, tmfResponse(resp)))
		}
	}
	return aborted, errors.Join(errs...)
}

// ResetLUN sends LOGICAL UNIT RESET for lun (an encoded SAM LUN). When the target answers
// "function complete", every command sent on this connection to that LUN before the reset
// fails with ErrTaskAborted.
func (s *Session) ResetLUN(ctx context.Context, lun uint64) error {
	c := s.cur.Load()
	if c == nil || c.dead() {
		return &ConnError{Target: s.cfg.TargetName, Portal: s.portal, Err: ErrNotLoggedIn}
	}
	resp, err := c.tmf(ctx, pdu.TMFLogicalUnitReset, lun, pdu.ReservedTag, 0)
	if err != nil {
		return fmt.Errorf("LOGICAL UNIT RESET: %w", err)
	}
	if resp != 0 {
		return fmt.Errorf("LOGICAL UNIT RESET: target answered %d (%s)", resp, tmfResponse(resp))
	}
	return nil
}

// tmf runs one task management function whose confirmed effect ends live tasks.
func (c *conn) tmf(ctx context.Context, fn uint8, lun uint64, ref, refCmdSN uint32) (uint8, error) {
	t, err := c.acquire(ctx, kindTMF)
	if err != nil {
		return 0, err
	}
	t.ref, t.tmfFn, t.endLive, t.lun = ref, fn, true, lun
	var out ctlResult
	encode := func(t *task, cmdSN, expStatSN uint32) {
		t.mu.Lock()     // the reader reads it under t.mu when the response comes (endLUNTasks)
		t.cmdSN = cmdSN // commands sent before the TMF have a lower CmdSN
		t.mu.Unlock()
		r := pdu.TaskMgmtRequest{Immediate: true, Function: fn, LUN: lun, ITT: t.itt,
			RefTaskTag: ref, CmdSN: cmdSN, ExpStatSN: expStatSN, RefCmdSN: refCmdSN}
		r.Encode(&t.bhs)
	}
	if err := c.sendControl(t, encode, nil); err != nil {
		return 0, c.finishAfterConnLoss(t, &out)
	}
	if err := c.wait(ctx, t, &out); err != nil {
		return 0, err
	}
	return out.bhs.Response(), nil
}

// endLUNTasks fails every live SCSI task to tmf.lun sent before the LOGICAL UNIT RESET (called
// by the reader with tmf.mu held, on "function complete").
func (c *conn) endLUNTasks(tmf *task) {
	if tmf.ctlBHS.Response() != 0 {
		return
	}
	for i := range c.tasks[:c.nSCSI] {
		t := &c.tasks[i]
		t.mu.Lock()
		if !t.active || t.completed || t.tag.Load() == 0 || t.lun != tmf.lun || !serialLT(t.cmdSN, tmf.cmdSN) {
			t.mu.Unlock()
			continue
		}
		c.complete(t, abortedError(pdu.TMFLogicalUnitReset)) // unlocks; reaps abandoned tasks
	}
}

func tmfResponse(r uint8) string {
	switch r {
	case 0:
		return "function complete"
	case 1:
		return "task does not exist"
	case 2:
		return "LUN does not exist"
	case 3:
		return "task still allegiant"
	case 4:
		return "task allegiance reassignment not supported"
	case 5:
		return "task management function not supported"
	case 6:
		return "function authorization failed"
	case 255:
		return "function rejected"
	}
	return "unknown"
}
