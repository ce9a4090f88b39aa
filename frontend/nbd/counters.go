package nbd

import (
	"time"

	"github.com/iser-blk/iser-blk/internal/status"
)

// Request counting for status and metrics (Options.Counters; issue 16). A request is counted
// from the moment the reader has decoded it to the moment its reply is written (or the
// connection drops it), per operation, with atomics only: no lock, no allocation. With
// Options.Counters nil nothing is counted and nothing is timed.

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

// countBegin starts counting r (the reader calls it once r is decoded).
func (c *conn) countBegin(r *request) {
	if c.s.opts.Counters == nil {
		return
	}
	if _, ok := countedOp(r); ok {
		r.started = time.Now()
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

// countReply counts r's outcome as its reply is written.
func (c *conn) countReply(r *request) {
	if c.s.opts.Counters == nil {
		return
	}
	op, ok := countedOp(r)
	if !ok {
		return
	}
	n := 0
	if r.Type == cmdRead || r.Type == cmdWrite {
		n = int(r.Length)
	}
	c.s.opts.Counters.Abandon() // leaves in flight; End wants an error value, this has an errno
	c.s.opts.Counters.Op(op).Observe(n, time.Since(r.started), r.errno != 0)
}
