package iser

// The request run: one command through the retry policy on a chosen path, and for recoverable
// paths the wait for a path and the re-issue on another after a connection loss (recovery.go,
// replay.go); fanout runs the pieces of a split request concurrently.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser/internal/session"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

// run executes r's command with the retry policy on the least loaded path. When the command
// fails because its path went down (not with a SCSI status), it is re-issued: with recoverable
// paths, on the first path that is up (waiting up to the replacement timeout for one, see
// recovery.go); otherwise once on each other connected path. READ and WRITE are idempotent, and
// the block contract forbids failing a request that another session could serve.
func (d *Device) run(ctx context.Context, r *request) error {
	if d.recovering {
		return d.runRecovering(ctx, r)
	}
	var failed *path
	for attempt := 0; ; attempt++ {
		p := d.pick(failed)
		p.outstanding.Add(1)
		err := d.retry.Execute(ctx, p.ex, &r.cmd, &r.resp)
		p.outstanding.Add(-1)
		p.commands.Add(1)
		if err == nil || attempt+1 >= len(d.paths) || !pathFailure(err, p) || ctx.Err() != nil {
			return err
		}
		failed = p
		if next := d.pick(failed); next == failed || !next.up() {
			return err
		}
		d.log.Warn("path failed; re-issuing on another session", zap.String("command", r.cmd.Name()), zap.Error(err))
	}
}

// runRecovering is run over recoverable paths: a command failed by a connection loss waits for a
// path (this one reinstated, or another) and is re-issued, at most maxReplays times.
func (d *Device) runRecovering(ctx context.Context, r *request) error {
	var failed *path
	seq := d.seq.Add(1)
	queued := false // seq is in d.replays
	defer func() {
		if queued {
			d.replays.remove(seq)
		}
	}()
	for replays := 0; ; {
		// Replays go oldest first, one at a time; new commands wait behind them (replay.go).
		if queued {
			if err := d.replays.waitTurn(ctx, d.bgDone(), seq); err != nil {
				return err
			}
		} else if d.replays.n.Load() > 0 {
			if err := d.replays.waitEmpty(ctx, d.bgDone()); err != nil {
				return err
			}
		}
		p := d.pick(failed)
		if p == nil {
			if err := d.waitPath(ctx); err != nil {
				if failed != nil {
					failed.pending.Add(-1) // it will not be replayed after all
				}
				return err
			}
			continue
		}
		if p.outstanding.Add(1) == 1 {
			p.touch() // the command watchdog measures from the first command after idle
		}
		err := d.retry.Execute(ctx, p.ex, &r.cmd, &r.resp)
		p.outstanding.Add(-1)
		p.commands.Add(1)
		if failed != nil {
			failed.pending.Add(-1) // replayed (or failed again, counted again below)
			failed = nil
		}
		aborted := errors.Is(err, session.ErrTaskAborted) // the command watchdog ended it
		if !aborted && p.escalation.Load() != 0 {
			p.escalation.Store(0) // progress: the next stuck episode starts with ABORT TASK again
		}
		if err == nil || ctx.Err() != nil || (!aborted && !pathFailure(err, p)) {
			p.touch()
			return err
		}
		if replays++; replays > maxReplays || d.closed.Load() {
			return err
		}
		if !queued {
			d.replays.add(seq)
			queued = true
		}
		p.pending.Add(1)
		p.replayedTotal.Add(1)
		d.log.Debug("connection lost; command will be re-issued", zap.String("portal", p.name),
			zap.String("command", r.cmd.Name()), zap.Int("replay", replays), zap.Error(err))
		failed = p
	}
}

// pathFailure reports an error of the path itself (its connection is now down), as opposed to
// a completed command's SCSI status or the caller's context.
func pathFailure(err error, p *path) bool {
	// A connection error is one whatever its cause says (a keepalive's deadline, a timeout).
	var ce *session.ConnError
	if errors.As(err, &ce) {
		return true
	}
	var se *scsi.SenseError
	var st *scsi.StatusError
	if errors.As(err, &se) || errors.As(err, &st) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	return !p.up()
}

// fanout runs piece(0..n-1) with at most maxFanout in flight and returns the first error. The
// caller's goroutine works too, so a two-piece request starts one goroutine.
func fanout(n int, piece func(i int) error) error {
	if n == 1 {
		return piece(0)
	}
	var (
		next    atomic.Int64
		mu      sync.Mutex
		first   error
		wg      sync.WaitGroup
		workers = min(n, maxFanout)
	)
	work := func() {
		for {
			i := int(next.Add(1) - 1)
			if i >= n {
				return
			}
			if err := piece(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}
	}
	wg.Add(workers - 1)
	for range workers - 1 {
		go func() { defer wg.Done(); work() }()
	}
	work()
	wg.Wait()
	return first
}
