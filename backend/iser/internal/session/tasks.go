package session

// The task table: a slot per outstanding command (its ITT indexes it), claimed and released by
// the submitters, looked up by the reader; and the CmdSN window that bounds what may be sent.

import (
	"context"
	"slices"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
)

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
	t.lent = false
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
	select {
	case <-t.win: // cannot happen (waitWindow consumes or passes on its wake-up); stay clean anyway
	default:
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
// sendMu held on success. Waiters queue in winQ and each advance of MaxCmdSN wakes as many of them
// as it opened slots, first come first: waking every waiter for every slot (what a broadcast
// does) costs a goroutine wake-up per waiter per completed command once the target's window is
// smaller than the queue depth (LIO: 64 commands), and it let newcomers overtake the waiters.
func (c *conn) waitWindow(ctx context.Context, t *task) error {
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
		c.winQ = append(c.winQ, t)
		c.winMu.Unlock()
		var err error
		select {
		case <-t.win:
		case <-ctx.Done():
			err = ctx.Err()
		case <-c.done:
			err = c.connErr()
		}
		if err != nil {
			c.leaveWindowQueue(t)
		}
		c.winWaiters.Add(-1)
		if err != nil {
			return err
		}
		// Woken: a slot opened for us, though a sender that did not wait may have taken it;
		// then we queue again at the end.
	}
}

// leaveWindowQueue takes a waiter that gives up out of winQ, or, if it was woken as it gave up,
// passes the wake-up on to the next waiter.
func (c *conn) leaveWindowQueue(t *task) {
	c.winMu.Lock()
	defer c.winMu.Unlock()
	if i := slices.Index(c.winQ, t); i >= 0 {
		c.winQ = slices.Delete(c.winQ, i, i+1)
		return
	}
	select {
	case <-t.win:
		c.wakeWindowLocked(1)
	default:
	}
}

// wakeWindowLocked wakes the first n waiters of winQ (winMu held).
func (c *conn) wakeWindowLocked(n uint32) {
	k := int(min(n, uint32(len(c.winQ))))
	for _, w := range c.winQ[:k] {
		select {
		case w.win <- struct{}{}:
		default: // cannot happen: a task is queued once and drains its wake-up before queueing again
		}
	}
	c.winQ = append(c.winQ[:0], c.winQ[k:]...)
}

// windowWaiters reports whether commands wait for the window: Submit then declines rather than
// overtake them.
func (c *conn) windowWaiters() bool { return c.winWaiters.Load() > 0 }

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
	if old := c.maxCmdSN.Load(); serialGT(maxSN, old) {
		// The reader is the only writer of maxCmdSN. Waiters register (winWaiters) before they
		// re-check maxCmdSN, so either they see the new value or we see them: the lock is taken
		// only when someone waits.
		c.maxCmdSN.Store(maxSN)
		if c.winWaiters.Load() > 0 {
			c.winMu.Lock()
			c.wakeWindowLocked(maxSN - old) // serial difference: the slots that opened
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
