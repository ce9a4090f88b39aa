package session

// Lent write data: with Config.LendPages the transport may send a large write's data by
// reference (transport.OutPDU.Lent; over TCP vmsplice + splice) instead of copying it. The kernel
// then holds the caller's pages until the target has read them, so a task whose data was lent
// must not hand its buffer back while the target may still read it. Every way out of such a
// task is made safe:
//   - The task's response, or a task management response on the same connection: the target
//     reads a connection in order, so it had read every byte sent before. The buffer is free.
//   - The caller's context ends while the connection lives: the task is not abandoned, since a
//     later command on the same connection could reach the target before the target reads
//     this one's data. ABORT TASK is sent and the task waits for its answer (abortLent); the
//     caller then gets ctx.Err(). An ABORT TASK that goes unanswered or is refused ends the
//     connection, which is the next case.
//   - The connection is lost (or given up on) before an answer: the task waits (holdLent) until
//     a later login has reinstated the session, since the target ends the old session's tasks
//     and connections before it answers that login (RFC 7143 §6.3.5), or the session closes, or
//     Config.LendHold passes. Only then does it fail with the ConnError, to be re-issued. A
//     caller that gives up meanwhile gets ctx.Err() at once: its write failed, and nothing sent
//     later can reach the target before that reinstatement (the old connection is gone).
//
// A command submitted without an owner (Submit) never lends: nothing would hold its buffer.
// Config.LendPages is for sessions that are reinstated when lost (a recovery loop calls Login),
// where waiting for the reinstatement costs the re-issue nothing.

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

// defaultLendHold bounds the wait for a reinstatement when Config.LendHold is 0: open-iscsi's
// replacement_timeout, after which I/O fails anyway.
const defaultLendHold = 120 * time.Second

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
// the connection, and the task waits for the reinstatement instead.
func (c *conn) abortLent(lun uint64, itt, cmdSN uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.tmf(ctx, pdu.TMFAbortTask, lun, itt, cmdSN)
	if err == nil && resp <= 1 { // function complete, or task does not exist (it had ended)
		return
	}
	if err == nil {
		err = fmt.Errorf("target answered %d (%s)", resp, tmfResponse(resp))
	}
	c.log.Warn("ABORT TASK of a write whose data is lent failed; dropping the connection",
		zap.Uint32("itt", itt), zap.Error(err))
	c.shutdown(fmt.Errorf("ABORT TASK of ITT 0x%08x: %w", itt, err))
}

// holdLent waits until the target can no longer read t's lent pages after the connection was
// lost: the session reinstated or closed (c.superseded), or Config.LendHold passed. A target
// that answered a Logout has read everything, so nothing is held then. A caller that gives up
// is let go: its write has failed, so the range's contents are undefined, and every later
// command reaches the target only after the reinstatement that ends this one (the connection
// is gone, and Login is the only way to a new one).
func (c *conn) holdLent(ctx context.Context, t *task) {
	if c.loggedOut.Load() || ctx.Err() != nil {
		return
	}
	select {
	case <-c.superseded:
		return
	default:
	}
	c.log.Debug("write data lent to a lost connection: waiting for the session's reinstatement",
		zap.Uint32("itt", t.itt))
	timer := time.NewTimer(c.s.cfg.LendHold)
	defer timer.Stop()
	select {
	case <-c.superseded:
	case <-ctx.Done():
	case <-timer.C:
		c.log.Warn("session not reinstated in time; failing a write whose data the old connection may still hold",
			zap.Uint32("itt", t.itt), zap.Duration("waited", c.s.cfg.LendHold))
	}
}

// supersede marks c as one the target can no longer read (see conn.superseded).
func (c *conn) supersede() {
	c.supersededOnce.Do(func() { close(c.superseded) })
}
