// Package gate is the door between a frontend and the device stack that the gateway's lifecycle
// controls. It is a block.Device in front of the stack and does two things:
//
//   - Hand-over (a planned restart, a stop that keeps the device): Shut shuts the door and waits
//     until every request that went through has ended. Requests that arrive once it is closed
//     wait in front of it and are never answered by this process image — the kernel gives them
//     to the next one (ublk with UBLK_F_USER_RECOVERY_REISSUE requeues the requests a dead server
//     held; kernel NBD requeues them on the reconnected sockets). Answering them, even with an
//     error, would either lose them (EIO to the filesystem) or let a write land in the cache
//     after the final flush.
//   - The dirty mark (a write-back cache below): with a Recorder, the state file says dirty
//     exactly while acknowledged writes may be missing from the target. The first write after a
//     clean point is let through only once RecordDirty succeeded; a Flush through the gate that
//     leaves the stack with nothing dirty, and MarkClean, record clean again. A crash of an idle
//     or just-flushed gateway then leaves a clean state, and its successor resumes instead of
//     fencing the device.
//
// Invariants: no write is acknowledged while the recorded state is clean (see markDirty and
// tryClean for the ordering argument); while open the gate costs a few atomic operations per
// request and allocates nothing; a request parked at a closed door is released only by Reopen
// or by its own context ending.
package gate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/iser-blk/iser-blk/block"
)

// Recorder records the device's state where a successor reads it (internal/takeover's state
// file). Both calls must be durable when they return nil.
type Recorder interface {
	RecordDirty() error
	RecordClean() error
}

// Options configure a Gate.
type Options struct {
	// Recorder, if set, is kept told whether acknowledged writes may be unwritten (nil: the stack
	// never holds any, or nobody reads the state).
	Recorder Recorder
	// Dirty is what the state already says when the gate opens: true keeps the next write from
	// recording again, and a Flush records clean once nothing is dirty.
	Dirty bool
}

// ErrRecord wraps the error of a write refused because its dirty mark could not be recorded.
var ErrRecord = errors.New("cannot record the device's state as dirty")

// Gate is a block.Device in front of the served stack. It forwards the frontends' optional
// fast paths (CachedReader, CachedWriter, Submitter, PipeSubmitter): each answers false when
// the device below lacks it, the door is closed, or a write would need a dirty mark first, and
// the frontend then takes ReadAt or WriteAt, which wait at the door or record the mark.
//
// Lock order: recMu is taken alone (markDirty, tryClean); mu is taken alone (the door's held
// channel). Neither is held while a request runs.
type Gate struct {
	block.Device
	inflight atomic.Int64
	closed   atomic.Bool
	idle     chan struct{} // a token once inflight drops to 0 with the door closed

	mu   sync.Mutex
	held chan struct{} // closed when the door reopens; waiting requests then go through

	// The dirty mark: writers counts writes from before their dirty check until the device
	// below has stored them; recorded is what the state file says (true: dirty).
	rec      Recorder
	dirty    block.DirtyReporter // nil: the device below holds nothing unwritten
	writers  atomic.Int64
	recorded atomic.Bool
	recMu    sync.Mutex

	cachedR block.CachedReader
	cachedW block.CachedWriter
	sub     block.Submitter
	pipeSub block.PipeSubmitter
	pool    sync.Pool // *gatedCompletion
}

// New puts a gate, open, in front of dev.
func New(dev block.Device, opts Options) *Gate {
	g := &Gate{Device: dev, idle: make(chan struct{}, 1), held: make(chan struct{}), rec: opts.Recorder}
	close(g.held) // open
	g.recorded.Store(opts.Dirty)
	g.dirty, _ = dev.(block.DirtyReporter)
	g.cachedR, _ = dev.(block.CachedReader)
	g.cachedW, _ = dev.(block.CachedWriter)
	g.sub, _ = dev.(block.Submitter)
	g.pipeSub, _ = dev.(block.PipeSubmitter)
	g.pool.New = func() any { return &gatedCompletion{g: g} }
	return g
}

// tryEnter counts a request in unless the door is closed.
func (g *Gate) tryEnter() bool {
	g.inflight.Add(1)
	if !g.closed.Load() {
		return true
	}
	g.exit()
	return false
}

// exit counts a request out, waking a Shut that waits for the last one.
func (g *Gate) exit() {
	if g.inflight.Add(-1) == 0 && g.closed.Load() {
		select {
		case g.idle <- struct{}{}:
		default:
		}
	}
}

// enter counts a request in, waiting in front of a closed door until it reopens. Only ctx ending
// — the frontend tearing its server down — lets a waiting request go with an error.
func (g *Gate) enter(ctx context.Context) error {
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

// Shut shuts the door and waits until every request that went through it has ended, or ctx
// ends (the door is then reopened and ctx's error returned).
func (g *Gate) Shut(ctx context.Context) error {
	g.mu.Lock()
	g.held = make(chan struct{})
	g.mu.Unlock()
	g.closed.Store(true)
	for g.inflight.Load() != 0 {
		select {
		case <-g.idle:
		case <-ctx.Done():
			g.Reopen()
			return ctx.Err()
		}
	}
	return nil
}

// Reopen lets waiting and new requests through again (a hand-over that failed).
func (g *Gate) Reopen() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed.Swap(false) {
		close(g.held)
	}
}

// IsShut reports whether the door is shut.
func (g *Gate) IsShut() bool { return g.closed.Load() }

// Inflight is the number of requests through the door that have not ended.
func (g *Gate) Inflight() int64 { return g.inflight.Load() }

// beginWrite counts a write in for the dirty mark and records the mark first when the state
// says clean. On error nothing was let through.
func (g *Gate) beginWrite() error {
	if g.rec == nil {
		return nil
	}
	g.writers.Add(1)
	if g.recorded.Load() {
		return nil
	}
	if err := g.markDirty(); err != nil {
		g.writers.Add(-1)
		return err
	}
	return nil
}

// enterWrite is enter and beginWrite for a request that changes data: through the door, and
// with the dirty mark recorded. On error the request is out again.
func (g *Gate) enterWrite(ctx context.Context) error {
	if err := g.enter(ctx); err != nil {
		return err
	}
	if err := g.beginWrite(); err != nil {
		g.exit()
		return err
	}
	return nil
}

// exitWrite ends what enterWrite began.
func (g *Gate) exitWrite() {
	g.endWrite()
	g.exit()
}

// endWrite counts a write out once the device below has stored it (dirty pages counted).
func (g *Gate) endWrite() {
	if g.rec != nil {
		g.writers.Add(-1)
	}
}

// markDirty records the dirty mark unless someone did meanwhile.
func (g *Gate) markDirty() error {
	g.recMu.Lock()
	defer g.recMu.Unlock()
	if g.recorded.Load() {
		return nil
	}
	if err := g.rec.RecordDirty(); err != nil {
		return fmt.Errorf("%w: %w: %w", block.ErrIO, ErrRecord, err)
	}
	g.recorded.Store(true)
	return nil
}

// tryClean records clean when nothing below is dirty and no write is between its dirty check
// and its store. The order is what makes it safe: recorded is cleared before writers and the
// dirty bytes are read. A write that read recorded as true did so before the clear (no one else
// sets it while recMu is held here), so its writers.Add came before this load of writers: it is
// counted there, or it already stored its data and the dirty bytes count it. A write that reads
// false after the clear takes recMu in markDirty and records dirty after this clean.
func (g *Gate) tryClean() (bool, error) {
	g.recMu.Lock()
	defer g.recMu.Unlock()
	if !g.recorded.Load() {
		return true, nil
	}
	g.recorded.Store(false)
	if g.writers.Load() != 0 || (g.dirty != nil && g.dirty.DirtyBytes() != 0) {
		g.recorded.Store(true)
		return false, nil
	}
	if err := g.rec.RecordClean(); err != nil {
		g.recorded.Store(true) // the file may still say dirty: assume it does
		return false, err
	}
	return true, nil
}

// MarkClean records clean now if nothing is dirty (a hand-over's or a shutdown's write-back
// has just succeeded). clean is false when something is still dirty or being written; err is
// the recorder's. Without a Recorder it reports clean.
func (g *Gate) MarkClean() (clean bool, err error) {
	if g.rec == nil {
		return true, nil
	}
	return g.tryClean()
}

func (g *Gate) ReadAt(ctx context.Context, p []byte, off int64) error {
	if err := g.enter(ctx); err != nil {
		return err
	}
	defer g.exit()
	return g.Device.ReadAt(ctx, p, off)
}

func (g *Gate) WriteAt(ctx context.Context, p []byte, off int64, f block.WriteFlags) error {
	if err := g.enterWrite(ctx); err != nil {
		return err
	}
	defer g.exitWrite()
	return g.Device.WriteAt(ctx, p, off, f)
}

// Flush is the device's; one that succeeds records clean when it left nothing dirty. A failure
// to record is not the flush's: the data is on the target, and the state stays dirty (safe).
func (g *Gate) Flush(ctx context.Context) error {
	if err := g.enter(ctx); err != nil {
		return err
	}
	defer g.exit()
	err := g.Device.Flush(ctx)
	if err == nil && g.rec != nil {
		_, _ = g.tryClean()
	}
	return err
}

func (g *Gate) Discard(ctx context.Context, off, n int64) error {
	if err := g.enterWrite(ctx); err != nil {
		return err
	}
	defer g.exitWrite()
	return g.Device.Discard(ctx, off, n)
}

func (g *Gate) WriteZeroes(ctx context.Context, off, n int64, f block.ZeroFlags) error {
	if err := g.enterWrite(ctx); err != nil {
		return err
	}
	defer g.exitWrite()
	return g.Device.WriteZeroes(ctx, off, n, f)
}

// ReadCached is the device's, while the door is open.
func (g *Gate) ReadCached(p []byte, off int64) bool {
	if g.cachedR == nil || !g.tryEnter() {
		return false
	}
	defer g.exit()
	return g.cachedR.ReadCached(p, off)
}

// WriteCached is the device's, while the door is open and the dirty mark is recorded: a write
// stored after the final flush would be acknowledged and then lost with the process image, and
// the mark's file write does not belong on the frontend's reading goroutine (WriteAt does it).
func (g *Gate) WriteCached(p []byte, off int64) bool {
	if g.cachedW == nil || !g.tryEnter() {
		return false
	}
	defer g.exit()
	if g.rec != nil {
		g.writers.Add(1)
		defer g.writers.Add(-1)
		if !g.recorded.Load() {
			return false
		}
	}
	return g.cachedW.WriteCached(p, off)
}

// SubmitAt is the device's, while the door is open (and, for a write, the dirty mark is
// recorded); the request counts until it completes.
func (g *Gate) SubmitAt(ctx context.Context, p []byte, off int64, write bool, f block.WriteFlags, done block.Completion) bool {
	if g.sub == nil || !g.tryEnter() {
		return false
	}
	counted := write && g.rec != nil
	if counted {
		g.writers.Add(1)
		if !g.recorded.Load() {
			g.writers.Add(-1)
			g.exit()
			return false
		}
	}
	c := g.pool.Get().(*gatedCompletion)
	c.done, c.write = done, counted
	if g.sub.SubmitAt(ctx, p, off, write, f, c) {
		return true
	}
	c.done = nil
	g.pool.Put(c)
	if counted {
		g.writers.Add(-1)
	}
	g.exit()
	return false
}

// Kick is the device's.
func (g *Gate) Kick() {
	if g.sub != nil {
		g.sub.Kick()
	}
}

// SubmitReadToPipe is the device's, while the door is open; the read counts until it completes.
func (g *Gate) SubmitReadToPipe(ctx context.Context, pipe block.Pipe, n int, off int64, done block.Completion) bool {
	if g.pipeSub == nil || !g.tryEnter() {
		return false
	}
	c := g.pool.Get().(*gatedCompletion)
	c.done, c.write = done, false
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
	g     *Gate
	done  block.Completion
	write bool // counted in writers
}

func (c *gatedCompletion) release() (*Gate, block.Completion, bool) {
	g, done, write := c.g, c.done, c.write
	c.done, c.write = nil, false
	g.pool.Put(c)
	return g, done, write
}

func (c *gatedCompletion) Complete(err error) {
	g, done, write := c.release()
	if write {
		g.writers.Add(-1) // stored (the completion runs after the data is in place)
	}
	done.Complete(err)
	g.exit() // after the answer: a hand-over's write-back must see what this request stored
}

// CompleteBatched keeps the backend's completions in runs (block.BatchCompletion) through the
// gate. Leaving the gate before the returned Flush is safe: the request's data is stored when
// its completion runs, and the flush only sends a reply already queued.
func (c *gatedCompletion) CompleteBatched(err error) block.Flusher {
	g, done, write := c.release()
	if write {
		g.writers.Add(-1)
	}
	f := block.CompleteBatched(done, err)
	g.exit()
	return f
}
