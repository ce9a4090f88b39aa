package cache

import "sync/atomic"

// streamSet tracks sequential streams of one kind of request (the cache has one for reads and
// one for writes). Reads use it for read-ahead (a miss where a stream expects one is sequential)
// and for the read-around cutoff; writes for the write-around cutoff. One type for both, so the
// two sides cannot drift apart: a request of at least the cutoff goes around the pages, and one of
// a quarter of it too when it continues a stream that has moved cutoff bytes in a row already.
//
// A stream's next is where its next request is expected. For reads that is the end of what the
// last miss filled, read-ahead included, so that the miss after a run of hits on read-ahead
// pages is found to continue the stream; before this, the read-around side kept its own streams
// that expected the request's end, which a read-ahead never let a miss reach, so with the default
// read-ahead a stream of 128 KiB reads never went around.
type streamSet struct {
	s     [16]stream
	clock atomic.Int64 // orders the streams' use
}

// stream is a sequential stream: where its next request is expected, how many bytes it has moved
// (or read ahead) in a row, and when it was last used (streamSet.clock). Its fields are read and
// written without a lock: a lost update only routes one request through the pages instead of
// around them (or reads ahead when it need not), and both are correct.
type stream struct {
	next, run, used atomic.Int64
}

// continues reports whether a request at off continues a stream.
func (ss *streamSet) continues(off int64) bool {
	for i := range ss.s {
		if ss.s[i].next.Load() == off {
			return true
		}
	}
	return false
}

// goesAround reports whether a request of n bytes at off goes around the pages (cutoff <= 0:
// never). It only reads the streams; note records the request.
func (ss *streamSet) goesAround(off int64, n int, cutoff int64) bool {
	switch {
	case cutoff <= 0 || int64(n) < cutoff/4:
		return false
	case int64(n) >= cutoff:
		return true
	}
	for i := range ss.s {
		if ss.s[i].next.Load() == off {
			return ss.s[i].run.Load() >= cutoff
		}
	}
	return false
}

// note records a request at off after which its stream expects the next one at end (the
// request's end, or beyond it by what was read ahead). It extends the stream it continues, or
// replaces the least recently used one (replacing round-robin would let each new stream evict an
// active one, whose next request would then evict another, and so on: no stream would ever reach
// the cutoff). Requests shorter than minLen are not tracked: the write side passes a quarter of
// its cutoff, so that small sequential writes stay cached, where they are acknowledged at once
// and coalesced.
func (ss *streamSet) note(off, end, minLen int64) {
	if end-off < minLen {
		return
	}
	now := ss.clock.Add(1)
	victim := &ss.s[0]
	for i := range ss.s {
		st := &ss.s[i]
		if st.next.Load() == off {
			st.run.Add(end - off)
			st.next.Store(end)
			st.used.Store(now)
			return
		}
		if st.used.Load() < victim.used.Load() {
			victim = st
		}
	}
	victim.run.Store(end - off)
	victim.next.Store(end)
	victim.used.Store(now)
}
