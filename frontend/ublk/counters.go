package ublk

import (
	"time"

	"github.com/iser-blk/iser-blk/internal/status"
)

// Request counting for status and metrics (Options.Counters; issue 16): per operation, from
// the worker's start of a request to its result, with atomics only — no lock, no allocation.

// countedOps maps ublk's operations (ublk_cmd.h UBLK_IO_OP_*) to the status package's; the
// others are not counted.
var countedOps = [...]struct {
	op status.Op
	ok bool
}{
	opRead:        {status.OpRead, true},
	opWrite:       {status.OpWrite, true},
	opFlush:       {status.OpFlush, true},
	opDiscard:     {status.OpTrim, true},
	opWriteZeroes: {status.OpWriteZeroes, true},
}

// serveCounted is serve, counted when the server has counters.
func (s *Server) serveCounted(t *tag) int32 {
	t.begin()
	res := s.serve(t)
	t.end(res)
	return res
}

// counted reports whether t's request is counted: the server has counters and knows the op.
func (t *tag) counted() bool {
	op := uint8(t.opFlags & 0xff)
	return t.q.srv.counters != nil && int(op) < len(countedOps) && countedOps[op].ok
}

// begin and end count a request, on the worker or the ring thread: begin when it starts, end
// with its result.
func (t *tag) begin() {
	if t.counted() {
		t.start = time.Now()
		t.q.srv.counters.Begin()
	}
}

func (t *tag) end(res int32) {
	if !t.counted() {
		return
	}
	r := t.request()
	n := 0
	if res >= 0 && r.transfers() {
		n = int(r.len)
	}
	t.q.srv.counters.Answered(countedOps[r.op].op, n, time.Since(t.start), res < 0)
}

// unbegin takes back a begin for a request the ring thread then hands to the worker, which
// counts it itself.
func (t *tag) unbegin() {
	if t.counted() {
		t.q.srv.counters.Abandon()
	}
}
