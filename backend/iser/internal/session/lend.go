package session

// Lent write data: with Config.LendPages the transport may send a large write's data by
// reference (transport.OutPDU.Lent; over TCP vmsplice + splice) instead of copying it. The kernel
// then references the caller's pages until the target has read them (a target on the same
// kernel: until its process reads its socket, which it may do even after our reset), so the
// caller must not reuse its buffer while the target can still read it and act on it.
//
// Where each way out of a lent task stands:
//   - Its response, or a task management response on the same connection: the target reads a
//     connection in order, so it had read every byte sent before. The buffer is free.
//   - Its caller gives up while the connection lives: the task is not abandoned, since a later
//     command on the same connection could reach the target, and be acknowledged, before the
//     target reads this one's data. ABORT TASK is sent and the task waits for its answer
//     (abortLent); the caller then gets ctx.Err(). An ABORT TASK that goes unanswered or is
//     refused ends the connection, which is the next case.
//   - The connection is lost before an answer: the task fails at once with its ConnError, as a
//     copied one does. From then on nothing this session sends reaches the target before a
//     later Login, which reinstates the session (same ISID, TSIH 0): the target ends the old
//     session's tasks and connections before it answers (RFC 7143 §6.3.5). So a command
//     re-issued on this session completes, and its caller reuses the buffer, only after the
//     old command can no longer run. What a stalled target may still do before that
//     reinstatement is run the old command with whatever the pages hold then, over the range
//     of a write that has not completed: if that write then fails for good (the replacement
//     timeout, the device closing, its caller giving up), its range holds undefined data, as
//     after any failed write, though here possibly another request's bytes.
//
// That argument needs the re-issue to go through this session. Another session to the same LUN
// (multipath, several sessions) could complete it, and let the buffer be reused, while the old
// connection's target still reads: Config.LendPages is for a device with one session only. A
// process that restarts logs in under a new ISID and reinstates nothing; a stalled old session's
// commands could then still run, lent or copied alike (docs/reliability.md).
//
// A command submitted without an owner (Submit) never lends: nothing would wait for its abort.

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

// lendable returns where the transport marks t's data lent, or nil when t's data must be copied:
// lending is off, t is no write, or the write is too small for the transport to lend.
func (c *conn) lendable(t *task) *bool {
	if !c.lends || t.dir != scsi.DirWrite || len(t.buf) < transport.LendMin {
		return nil
	}
	return &t.lent
}

// abortLent asks the target to end a task whose caller gave up but whose pages are lent (see the
// file comment). A confirmed ABORT TASK completes the task (tmf, endLive); anything else ends
// the connection, which fails the task (its caller gets ctx.Err()).
func (c *conn) abortLent(lun uint64, itt, cmdSN uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.tmf(ctx, pdu.TMFAbortTask, lun, itt, cmdSN)
	if err == nil && resp <= 1 { // function complete, or task does not exist (it had ended)
		return
	}
	if c.dead() {
		return // the connection is gone already: that failed the task
	}
	if err == nil {
		err = fmt.Errorf("target answered %d (%s)", resp, tmfResponse(resp))
	}
	c.log.Warn("ABORT TASK of a write whose data is lent failed; dropping the connection",
		zap.Uint32("itt", itt), zap.Error(err))
	c.shutdown(fmt.Errorf("ABORT TASK of ITT 0x%08x: %w", itt, err))
}
