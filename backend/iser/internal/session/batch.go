package session

import (
	"slices"

	"github.com/iser-blk/iser-blk/block"
)

// Completions in runs. One read(2) of the socket often brings the responses of several submitted
// commands (4 KiB reads at a deep queue). A Completer that is a BatchCompleter is completed with
// CompleteBatched, and whatever it left waiting (the NBD connection's reply writer, see
// block.BatchCompletion) is flushed once when the run ends: before the reader next reads from the
// socket (a header, or a data segment that is not all buffered), so nothing waits on input that
// may be slow to come, or after maxBatchedCompletions, so a
// stream that never drains the receive buffer does not hold replies back. The state is the
// reader's alone: every complete call runs on the reader goroutine.

// BatchCompleter is a Completer that the reader may complete in runs (see block.BatchCompletion):
// CompleteBatched instead of Complete, and Flush on what it returned before the reader waits.
type BatchCompleter interface {
	Completer
	CompleteBatched(err error) block.Flusher
}

// maxBatchedCompletions bounds a run: the reader flushes after this many batched completions even
// if more responses are buffered.
const maxBatchedCompletions = 32

// bufferedInput is implemented by a transport that can tell how much input it holds: Buffered is
// the number of bytes the reader can consume without waiting (TCP: read from the socket and not
// consumed yet; iSER: the PDUs already received).
type bufferedInput interface {
	Buffered() int
}

// batchState is the reader's run of completions.
type batchState struct {
	flushes []block.Flusher // distinct, in first-completion order
	n       int             // completions since the last flush
}

// completeAsync delivers err to a submitted command's completer (on the reader goroutine).
func (c *conn) completeAsync(done Completer, err error) {
	bc, ok := done.(BatchCompleter)
	if !ok {
		done.Complete(err)
		return
	}
	f := bc.CompleteBatched(err)
	if f == nil {
		return // nothing waits on this one: it does not lengthen the run
	}
	if !slices.Contains(c.batch.flushes, f) {
		c.batch.flushes = append(c.batch.flushes, f)
	}
	c.batch.n++
}

// flushDue reports whether the run must end before the reader reads the next need bytes:
// something waits and either that read may block (less than need is buffered) or the run is
// long enough.
func (c *conn) flushDue(need int) bool {
	if len(c.batch.flushes) == 0 {
		return false
	}
	if c.batch.n >= maxBatchedCompletions {
		return true
	}
	b, ok := c.tc.(bufferedInput)
	return !ok || b.Buffered() < need
}

// flushCompletions ends the run: every Flusher it collected is flushed once.
func (c *conn) flushCompletions() {
	for i, f := range c.batch.flushes {
		f.Flush()
		c.batch.flushes[i] = nil
	}
	c.batch.flushes = c.batch.flushes[:0]
	c.batch.n = 0
}
