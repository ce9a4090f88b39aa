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
	c := s.counters
	op := uint8(t.opFlags & 0xff)
	if c == nil || int(op) >= len(countedOps) || !countedOps[op].ok {
		return s.serve(t)
	}
	start := time.Now()
	c.Begin()
	res := s.serve(t)
	n := 0
	if op == opRead || op == opWrite {
		n = int(t.nrSectors) << sectorShift
	}
	c.Answered(countedOps[op].op, n, time.Since(start), res < 0)
	return res
}
