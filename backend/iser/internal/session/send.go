package session

import (
	"runtime"

	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
)

// queued is one PDU waiting in the send queue.
type queued struct {
	out  transport.OutPDU
	done chan error // gets the write result when another sender flushes this PDU
}

// submitLocked queues one PDU and returns when it has been written (or the write failed). The
// caller holds sendMu, having filled CmdSN/ExpStatSN, so PDUs are queued in CmdSN order;
// submitLocked releases sendMu.
//
// Combining: if no flush is in progress the caller becomes the flusher and writes the queue
// (its own PDU plus whatever concurrent senders add meanwhile) in batches, one vectored write
// each, until the queue is empty; otherwise it waits for the flusher to report its PDU's result.
// The PDU's header and data must stay untouched until submitLocked returns.
func (c *conn) submitLocked(out transport.OutPDU, done chan error) error {
	c.queue = append(c.queue, queued{out: out, done: done})
	return c.flushLocked(done)
}

// submitManyLocked queues several PDUs of one sender (contiguous, in order) and returns when all
// have been written; only the last carries the completion signal.
func (c *conn) submitManyLocked(outs []transport.OutPDU, done chan error) error {
	if len(outs) == 0 {
		c.sendMu.Unlock()
		return nil
	}
	for i := range outs {
		var d chan error
		if i == len(outs)-1 {
			d = done
		}
		c.queue = append(c.queue, queued{out: outs[i], done: d})
	}
	return c.flushLocked(done)
}

func (c *conn) flushLocked(done chan error) error {
	if c.flushing {
		c.sendMu.Unlock()
		return <-done
	}
	// No flush in progress: our PDU will be in the first batch (after any that Submit queued).
	c.flushing = true
	// Let the senders that are already runnable queue their PDUs before we write: at queue depth
	// they were woken by the same read of the socket, and one writev for all of them costs what
	// one costs alone (loopback TCP: ~10 µs per call). With nobody runnable this is ~100 ns.
	c.sendMu.Unlock()
	runtime.Gosched()
	c.sendMu.Lock()
	return c.drainLocked(done)
}

// kick writes the PDUs that Submit queued, unless a flush in progress is about to.
func (c *conn) kick() {
	c.sendMu.Lock()
	if c.flushing || len(c.queue) == 0 {
		c.sendMu.Unlock()
		return
	}
	c.flushing = true
	_ = c.drainLocked(nil)
}

// drainLocked is the flusher's loop: called with sendMu held and flushing set, it writes the queue
// in batches until it is empty, clears flushing and releases sendMu. It returns the write result
// of the PDU whose completion channel is own (in the first batch). A failed write ends the
// connection here, since PDUs queued by Submit have no sender waiting to do it.
func (c *conn) drainLocked(own chan error) error {
	var ownErr error
	first := true
	for len(c.queue) > 0 {
		batch := c.queue
		c.queue = c.spare[:0]
		c.sendMu.Unlock()
		err := c.writeBatch(batch)
		if err != nil {
			if own == nil {
				// A kick: the caller is a frontend's reader or ring thread, which must not wait
				// for the transport's teardown (iSER: disconnect, destroy the QP, deregister).
				go c.shutdown(err)
			} else {
				c.shutdown(err)
			}
		}
		for i := range batch {
			if batch[i].done == nil {
				continue // submitted, or not the last PDU of a multi-PDU submission
			}
			if first && own != nil && batch[i].done == own {
				ownErr = err
				continue
			}
			batch[i].done <- err
		}
		first = false
		clear(batch) // drop references to buffers
		c.sendMu.Lock()
		c.spare = batch[:0]
	}
	c.flushing = false
	c.sendMu.Unlock()
	return ownErr
}

// writeBatch writes PDUs in order, in one call when the transport supports batches. Only the
// flusher calls it, so the transport sees serialised writes.
func (c *conn) writeBatch(batch []queued) error {
	// A PDU whose data may be lent takes the batch path even alone: WritePDU always copies.
	if bw, ok := c.tc.(transport.BatchWriter); ok && (len(batch) > 1 || batch[0].out.Lent != nil) {
		outs := c.outs[:0]
		for i := range batch {
			outs = append(outs, batch[i].out)
		}
		err := bw.WritePDUs(outs)
		clear(outs)
		c.outs = outs[:0]
		return err
	}
	for i := range batch {
		o := &batch[i].out
		var err error
		if o.Task != nil {
			err = c.tc.WriteCommand(o.BHS, o.AHS, o.Task)
		} else {
			err = c.tc.WritePDU(o.BHS, o.AHS, o.Data)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
