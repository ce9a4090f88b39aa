package main

// The intake gate of a planned restart (issue 17): the served device behind a door that the
// restart closes before its final write-back. Requests that were already through the door run to
// their end and are counted; requests that arrive once it is closed wait in front of it and are
// never answered by this process image — the kernel gives them to the next one (ublk with
// UBLK_F_USER_RECOVERY_REISSUE requeues the requests a dead server held; kernel NBD requeues
// them on the reconnected sockets). Answering them, even with an error, would either lose them
// (EIO to the filesystem) or let a write land in the cache after the final flush.

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/iser-blk/iser-blk/block"
)

// restartGate is a block.Device in front of the served stack. While open it costs two atomic
// adds and a load per request and allocates nothing (the asynchronous paths reuse pooled
// completion wrappers). It forwards the frontends' optional fast paths (CachedReader,
// CachedWriter, Submitter, PipeSubmitter): each answers false when the device below lacks it or
// the gate is closed, and the frontend then takes ReadAt or WriteAt, which wait at the door.
type restartGate struct {
	block.Device
	inflight atomic.Int64
	closed   atomic.Bool
	idle     chan struct{} // a token once inflight drops to 0 with the gate closed

	mu   sync.Mutex
	held chan struct{} // closed when the gate reopens; waiting requests then go through

	cachedR block.CachedReader
	cachedW block.CachedWriter
	sub     block.Submitter
	pipeSub block.PipeSubmitter
	pool    sync.Pool // *gatedCompletion
}

func newRestartGate(dev block.Device) *restartGate {
	g := &restartGate{Device: dev, idle: make(chan struct{}, 1), held: make(chan struct{})}
	close(g.held) // open
	g.cachedR, _ = dev.(block.CachedReader)
	g.cachedW, _ = dev.(block.CachedWriter)
	g.sub, _ = dev.(block.Submitter)
	g.pipeSub, _ = dev.(block.PipeSubmitter)
	g.pool.New = func() any { return &gatedCompletion{g: g} }
	return g
}

// tryEnter counts a request in unless the gate is closed.
func (g *restartGate) tryEnter() bool {
	g.inflight.Add(1)
	if !g.closed.Load() {
		return true
	}
	g.exit()
	return false
}

// exit counts a request out, waking a restart that waits for the last one.
func (g *restartGate) exit() {
	if g.inflight.Add(-1) == 0 && g.closed.Load() {
		select {
		case g.idle <- struct{}{}:
		default:
		}
	}
}

// enter counts a request in, waiting in front of a closed gate until it reopens. Only ctx ending
// — the frontend tearing its server down — lets a waiting request go with an error.
func (g *restartGate) enter(ctx context.Context) error {
	for !g.tryEnter() {
		g.mu.Lock()
		held := g.held
		g.mu.Unlock()
		select {
		case <-held:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// close shuts the door and waits until every request that went through it has ended, or ctx
// ends (the gate is then reopened and ctx's error returned).
func (g *restartGate) close(ctx context.Context) error {
	g.mu.Lock()
	g.held = make(chan struct{})
	g.mu.Unlock()
	g.closed.Store(true)
	for g.inflight.Load() != 0 {
		select {
		case <-g.idle:
		case <-ctx.Done():
			g.reopen()
			return ctx.Err()
		}
	}
	return nil
}

// reopen lets waiting and new requests through again (a restart that failed before the re-exec).
func (g *restartGate) reopen() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed.Swap(false) {
		close(g.held)
	}
}

// Inflight is the number of requests through the gate that have not ended.
func (g *restartGate) Inflight() int64 { return g.inflight.Load() }

func (g *restartGate) ReadAt(ctx context.Context, p []byte, off int64) error {
	if err := g.enter(ctx); err != nil {
		return err
	}
	defer g.exit()
	return g.Device.ReadAt(ctx, p, off)
}

func (g *restartGate) WriteAt(ctx context.Context, p []byte, off int64, f block.WriteFlags) error {
	if err := g.enter(ctx); err != nil {
		return err
	}
	defer g.exit()
	return g.Device.WriteAt(ctx, p, off, f)
}

func (g *restartGate) Flush(ctx context.Context) error {
	if err := g.enter(ctx); err != nil {
		return err
	}
	defer g.exit()
	return g.Device.Flush(ctx)
}

func (g *restartGate) Discard(ctx context.Context, off, n int64) error {
	if err := g.enter(ctx); err != nil {
		return err
	}
	defer g.exit()
	return g.Device.Discard(ctx, off, n)
}

func (g *restartGate) WriteZeroes(ctx context.Context, off, n int64, f block.ZeroFlags) error {
	if err := g.enter(ctx); err != nil {
		return err
	}
	defer g.exit()
	return g.Device.WriteZeroes(ctx, off, n, f)
}

// ReadCached is the device's, while the gate is open.
func (g *restartGate) ReadCached(p []byte, off int64) bool {
	if g.cachedR == nil || !g.tryEnter() {
		return false
	}
	defer g.exit()
	return g.cachedR.ReadCached(p, off)
}

// WriteCached is the device's, while the gate is open: a write stored after the final flush
// would be acknowledged and then lost with the process image.
func (g *restartGate) WriteCached(p []byte, off int64) bool {
	if g.cachedW == nil || !g.tryEnter() {
		return false
	}
	defer g.exit()
	return g.cachedW.WriteCached(p, off)
}

// SubmitAt is the device's, while the gate is open; the request counts until it completes.
func (g *restartGate) SubmitAt(ctx context.Context, p []byte, off int64, write bool, f block.WriteFlags, done block.Completion) bool {
	if g.sub == nil || !g.tryEnter() {
		return false
	}
	c := g.pool.Get().(*gatedCompletion)
	c.done = done
	if g.sub.SubmitAt(ctx, p, off, write, f, c) {
		return true
	}
	c.done = nil
	g.pool.Put(c)
	g.exit()
	return false
}

// Kick is the device's.
func (g *restartGate) Kick() {
	if g.sub != nil {
		g.sub.Kick()
	}
}

// SubmitReadToPipe is the device's, while the gate is open; the read counts until it completes.
func (g *restartGate) SubmitReadToPipe(ctx context.Context, pipe block.Pipe, n int, off int64, done block.Completion) bool {
	if g.pipeSub == nil || !g.tryEnter() {
		return false
	}
	c := g.pool.Get().(*gatedCompletion)
	c.done = done
	if g.pipeSub.SubmitReadToPipe(ctx, pipe, n, off, c) {
		return true
	}
	c.done = nil
	g.pool.Put(c)
	g.exit()
	return false
}

// gatedCompletion counts an asynchronous request out of the gate before passing its end on.
type gatedCompletion struct {
	g    *restartGate
	done block.Completion
}

func (c *gatedCompletion) Complete(err error) {
	g, done := c.g, c.done
	c.done = nil
	g.pool.Put(c)
	done.Complete(err)
	g.exit() // after the answer: the restart's write-back must see what this request stored
}

// CompleteBatched keeps the backend's completions in runs (block.BatchCompletion) through the
// gate. Leaving the gate before the returned Flush is safe: the request's data is stored when
// its completion runs, and the flush only sends a reply already queued.
func (c *gatedCompletion) CompleteBatched(err error) block.Flusher {
	g, done := c.g, c.done
	c.done = nil
	g.pool.Put(c)
	f := block.CompleteBatched(done, err)
	g.exit()
	return f
}
