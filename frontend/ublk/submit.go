package ublk

import (
	"github.com/iser-blk/iser-blk/block"
)

// Requests served from the ring thread (issue 37). A READ or WRITE the device can take without
// waiting is not handed to the tag's worker:
//   - one the device holds in memory (block.CachedReader, block.CachedWriter: a cache hit, a
//     write the write-back cache takes) is done on the ring thread and committed with the next
//     submission;
//   - one the device can start asynchronously (block.Submitter: the iSCSI session, through the
//     gate and the cache) is started there, and its completion comes back like a worker's.
//
// That saves, per request, the wake-up of the worker and the worker's wait for the device; and
// the device's completions come back in runs: the iSCSI session's reader completes every
// response of one socket read, then writes the eventfd once (block.BatchCompletion). Everything
// else (FLUSH, DISCARD, WRITE_ZEROES, a FUA write the device cannot start as one command,
// anything a device declines because it would wait) goes to the worker as before, so a slow
// request still holds only its own tag.
//
// The ring thread never waits for the device's answer: CachedReader, CachedWriter and SubmitAt
// decline rather than wait (their contracts), and a completion only appends to the queue's done
// list under its mutex. What it may still spend time on is the system calls those make for it,
// as the NBD frontend's reader does: Kick writes the queued commands to the iSCSI socket (it
// blocks only while the socket's send buffer is full; over iSER it posts them, waiting only
// while every send slot is in flight), and with --cache-dev a write the log takes is written to
// the cache file's page cache on the spot.
//
// Once the server stops (STOP_DEV), SubmitAt is no longer used: the drain timeout cancels the
// requests' context, which a worker's ReadAt/WriteAt honours and a started command does not (the
// Submitter contract), so requests arriving during the drain go to the workers. Commands
// already started end by their response or by the backend's command watchdog.

// ringPath is what the device offers the ring thread; nil fields are capabilities it lacks.
type ringPath struct {
	cachedR block.CachedReader
	cachedW block.CachedWriter
	sub     block.Submitter
}

// newRingPath asks dev for the optional interfaces the ring thread uses; off (Options.NoRingPath)
// leaves every request to the workers.
func newRingPath(dev block.Device, off bool) ringPath {
	if off {
		return ringPath{}
	}
	var p ringPath
	p.cachedR, _ = dev.(block.CachedReader)
	p.cachedW, _ = dev.(block.CachedWriter)
	p.sub, _ = dev.(block.Submitter)
	return p
}

// serveOnRing tries to serve t's request without its worker. It reports false, having done
// nothing, when the worker must serve it. On true the request is either finished (its commit
// queued for the next submission; err is a failure to queue it, fatal to the ring) or started
// (its completion will be taken from done).
func (q *queue) serveOnRing(t *tag) (served bool, err error) {
	p := &q.srv.ring
	r := t.request()
	if !r.transfers() || r.len == 0 || r.len > int64(len(t.buf)) {
		return false, nil
	}
	buf := t.buf[:r.len]
	write := r.op == opWrite
	flags := r.writeFlags()
	t.begin()
	switch {
	case !write && p.cachedR != nil && p.cachedR.ReadCached(buf, r.off),
		write && flags == 0 && p.cachedW != nil && p.cachedW.WriteCached(buf, r.off):
		t.end(int32(r.len))
		q.ended(t)
		return true, q.prepIOCmd(ioCommitAndFetch, t, int32(r.len))
	case p.sub != nil && !q.srv.stopping.Load() && q.submit(buf, r.off, write, flags, t):
		q.submitted = true
		return true, nil
	}
	t.unbegin()
	return false, nil
}

// submit starts t's request on the device, counted in started until its completion.
func (q *queue) submit(buf []byte, off int64, write bool, flags block.WriteFlags, t *tag) bool {
	q.started.Add(1)
	if q.srv.ring.sub.SubmitAt(q.srv.ioCtx, buf, off, write, flags, t) {
		return true
	}
	q.started.Done()
	return false
}

// kick sends what the device held back of the requests started since the last kick
// (block.Submitter.Kick); the ring thread calls it before it waits.
func (q *queue) kick() {
	if q.submitted {
		q.submitted = false
		q.srv.ring.sub.Kick()
	}
}

// Complete implements block.Completion for a request started with SubmitAt.
func (t *tag) Complete(err error) {
	if f := t.CompleteBatched(err); f != nil {
		f.Flush()
	}
}

// CompleteBatched implements block.BatchCompletion: the result joins the queue's done list, and
// the eventfd is written only by the Flush of the completion that found no wake-up pending, once
// the device has delivered its whole run.
func (t *tag) CompleteBatched(err error) block.Flusher {
	q := t.q
	res := q.srv.result(t.request(), err)
	t.end(res)
	wake := q.enqueueDone(t.id, res)
	q.started.Done() // t's buffer is the driver's again; q.Flush stays safe (efdMu)
	if !wake {
		return nil
	}
	return q
}

// Flush implements block.Flusher: it wakes the ring thread for the completions queued since the
// last wake.
func (q *queue) Flush() { q.wake() }
