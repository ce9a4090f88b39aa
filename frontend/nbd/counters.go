package nbd

import (
	"time"

	"github.com/iser-blk/iser-blk/internal/status"
)

// Request counting for status and metrics (Options.Counters; issue 16). A request is counted
// from the socket read that brought its header to the moment its reply is written (or the
// connection drops it), per operation, with atomics only: no lock, no allocation. With
// Options.Counters nil nothing is counted and nothing is timed. A request whose header was
// already buffered while the reader waited for a free slot (MaxInflight) is timed from that
// read, so its duration includes the wait: the client's view, as fio's clat is.
//
// The clock is read once per socket read on the reader's side and once per vectored write on the
// writer's, not twice per request: the requests that one read(2) brought in arrived together,
// and the replies that one writev sent left together, so their times are the same either way
// (after a payload that needed socket reads, which may have brought the next header, the clock
// is read again). At a deep queue this saves most of the clock reads.

// countedOps maps the NBD commands the gateway serves to the status package's operations; the
// others (CACHE, block status) are not counted.
var countedOps = [...]struct {
	op status.Op
	ok bool
}{
	cmdRead:        {status.OpRead, true},
	cmdWrite:       {status.OpWrite, true},
	cmdFlush:       {status.OpFlush, true},
	cmdTrim:        {status.OpTrim, true},
	cmdWriteZeroes: {status.OpWriteZeroes, true},
}

// countedOp is r's operation and whether it is counted.
func countedOp(r *request) (status.Op, bool) {
	if int(r.Type) >= len(countedOps) {
		return 0, false
	}
	o := countedOps[r.Type]
	return o.op, o.ok
}

// stampRead is called by the reader before it decodes a request header: when less than a header
// is buffered, the header comes from a new socket read and the next countBegin reads the clock.
func (c *conn) stampRead() {
	if c.s.opts.Counters != nil && c.br.Buffered() < requestHeaderLen {
		c.readStale = true
	}
}

// countBegin starts counting r (the reader calls it once r is decoded).
func (c *conn) countBegin(r *request) {
	if c.s.opts.Counters == nil {
		return
	}
	if _, ok := countedOp(r); ok {
		if c.readStale || c.readAt.IsZero() {
			c.readAt, c.readStale = time.Now(), false
		}
		r.started = c.readAt
		c.s.opts.Counters.Begin()
	}
}

// countDropped forgets r: the connection ends before it is answered.
func (c *conn) countDropped(r *request) {
	if c.s.opts.Counters == nil {
		return
	}
	if _, ok := countedOp(r); ok {
		c.s.opts.Counters.Abandon()
	}
}

// countReplies counts the outcome of the replies in batch, which were just written together.
func (c *conn) countReplies(batch []*request) {
	if c.s.opts.Counters == nil {
		return
	}
	now := time.Now()
	for _, r := range batch {
		c.countReply(r, now)
	}
}

// countReply counts r's outcome, its reply written at now.
func (c *conn) countReply(r *request, now time.Time) {
	op, ok := countedOp(r)
	if !ok {
		return
	}
	n := 0
	if r.Type == cmdRead || r.Type == cmdWrite {
		n = int(r.Length)
	}
	c.s.opts.Counters.Answered(op, n, now.Sub(r.started), r.errno != 0)
}
