package iser

// Recovery at ErrorRecoveryLevel 0 lives here, in the device layer, not in the session.
//
// Design: each path (one session) has a maintainer goroutine that owns the session's lifecycle:
// while the connection is up it runs the keepalive (a NOP-Out ping on an idle connection, RFC
// 7143 §11.18) and the command watchdog; when the connection ends (a transport error, a protocol
// violation, a missed NOP, a stuck command) it logs the path down and reinstates the session
// (Login again: same ISID, TSIH 0, §6.3.5) with capped exponential back-off and jitter, forever
// until the device is closed. The session stays a plain ERL 0 session that fails every
// outstanding task with a ConnError when its connection dies; the device, which still holds the
// command (CDB and caller's buffer), re-issues it on whichever path is up first, waiting at most
// the replacement timeout (open-iscsi's replacement_timeout) for one.
//
// Why the device layer: only it knows the other paths (failover needs them), and only it holds
// the request after the session has given the task up; keeping the session free of replay keeps
// its task table simple (a slot is never re-armed for a new connection).
//
// Replay semantics: only commands that were never acknowledged are re-issued (a response that
// raced in before the loss completes the command normally). Re-issuing an unacknowledged READ,
// WRITE, WRITE SAME, UNMAP or SYNCHRONIZE CACHE is idempotent: the same data goes to the same
// LBAs. It could only undo a later write if a client had issued overlapping writes concurrently,
// whose order the block contract (like SCSI's SIMPLE task attribute) leaves undefined anyway.
// Commands waiting for a path are woken together when one comes up; their order among
// themselves is not kept (they were concurrent, unacknowledged requests).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
)

// recoverableExecutor is an Executor whose connection can be watched and re-established (a
// *session.Session). The Device runs a maintainer goroutine for each one.
type recoverableExecutor interface {
	connectedExecutor
	// Login (re)establishes the connection (reinstating the session after a loss).
	Login(ctx context.Context) error
	// Done is closed when the current connection ends (nil when there is none).
	Done() <-chan struct{}
	// Err says why the last connection ended.
	Err() error
	// Ping sends a NOP-Out and waits for the NOP-In.
	Ping(ctx context.Context, payload []byte) error
	// Drop ends the current connection at once, failing its outstanding commands.
	Drop(cause error)
}

// taskManager is implemented by an Executor that can end stuck commands with task management
// functions (a *session.Session): the command watchdog tries them before dropping the
// connection.
type taskManager interface {
	// AbortOutstanding sends ABORT TASK for every outstanding command; the ones the target
	// confirms fail with session.ErrTaskAborted (and are re-issued). An error means some were
	// not confirmed.
	AbortOutstanding(ctx context.Context) (int, error)
	// ResetLUN sends LOGICAL UNIT RESET; on success every command to the LUN fails with
	// session.ErrTaskAborted.
	ResetLUN(ctx context.Context, lun uint64) error
}

// Escalation steps of the command watchdog.
const (
	escAbort = iota // ABORT TASK each outstanding command
	escReset        // LOGICAL UNIT RESET
	escDrop         // drop the connection
)

// Recovery configures keepalive, command timeout and session recovery.
type Recovery struct {
	// NOPInterval: a connection with no command completed for this long gets a NOP-Out ping
	// (0: no keepalive).
	NOPInterval time.Duration
	// NOPTimeout: a ping unanswered for this long drops the connection.
	NOPTimeout time.Duration
	// CommandTimeout: a path with commands outstanding and none completed for this long is
	// stuck. The watchdog escalates, one step per further CommandTimeout without progress:
	// ABORT TASK for each outstanding command, then LOGICAL UNIT RESET, then dropping the
	// connection (a step that fails moves on at once). Ended commands are re-issued (0: none).
	CommandTimeout time.Duration
	// ReplacementTimeout bounds how long I/O waits for a path when none is up, counted from the
	// moment the last path went down: after it, queued and new I/O fail with block.ErrNoPath
	// (EIO) until a path is back. 0 fails at once; negative waits forever.
	ReplacementTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the back-off between reinstatement attempts; the
	// first attempt is immediate, then ReconnectMin doubling up to ReconnectMax, ±20% jitter.
	ReconnectMin, ReconnectMax time.Duration
}

// DefaultRecovery is open-iscsi's contract: NOP every 5 s, 5 s to answer, 120 s replacement
// timeout; commands stuck for 30 s drop the connection.
func DefaultRecovery() Recovery {
	return Recovery{
		NOPInterval:        5 * time.Second,
		NOPTimeout:         5 * time.Second,
		CommandTimeout:     30 * time.Second,
		ReplacementTimeout: 120 * time.Second,
		ReconnectMin:       250 * time.Millisecond,
		ReconnectMax:       5 * time.Second,
	}
}

func (r *Recovery) normalize() {
	def := DefaultRecovery()
	if r.NOPInterval > 0 && r.NOPTimeout <= 0 {
		r.NOPTimeout = def.NOPTimeout
	}
	if r.ReconnectMin <= 0 {
		r.ReconnectMin = def.ReconnectMin
	}
	if r.ReconnectMax < r.ReconnectMin {
		r.ReconnectMax = max(def.ReconnectMax, r.ReconnectMin)
	}
}

// maxReplays bounds how often one command is re-issued after connection losses, so a command
// that itself kills every connection (a target that chokes on it) fails instead of looping.
const maxReplays = 16

// backoff returns the delay before reinstatement attempt n (0-based): 0, then min doubling to
// max, with ±20% jitter so that many initiators do not reconnect in lockstep.
func (r *Recovery) backoff(n int) time.Duration {
	if n == 0 {
		return 0
	}
	d := r.ReconnectMin
	for i := 1; i < n && d < r.ReconnectMax; i++ {
		d *= 2
	}
	d = min(d, r.ReconnectMax)
	j := int64(d) / 5
	if j > 0 {
		d += time.Duration(rand.Int64N(2*j+1) - j)
	}
	return d
}

// PathStats are the counters of one path (one session), for operators and tests.
type PathStats struct {
	Portal      string
	Up          bool
	Commands    uint64 // commands completed on this path (any status)
	Outstanding int64
	Downs       uint64 // connection losses seen
	Restores    uint64 // successful reinstatements
	Replayed    uint64 // commands that failed with this path's connection and were re-issued
	Aborts      uint64 // command-timeout escalations that ended the stuck commands by ABORT TASK
	LUNResets   uint64 // ... by LOGICAL UNIT RESET
	ALUA        string // the port group's access state ("" without ALUA)
}

// PathStats returns the counters of every path.
func (d *Device) PathStats() []PathStats {
	out := make([]PathStats, len(d.paths))
	for i, p := range d.paths {
		out[i] = PathStats{Portal: p.name, Up: p.up(), Commands: p.commands.Load(), Outstanding: p.outstanding.Load(),
			Downs: p.downs.Load(), Restores: p.restores.Load(), Replayed: p.replayedTotal.Load(),
			Aborts: p.aborts.Load(), LUNResets: p.lunResets.Load()}
		if st := p.aluaState.Load(); st >= 0 {
			out[i].ALUA = scsi.ALUAState(st).String()
		}
	}
	return out
}

// pathState: the device's view of path availability, for waiters and the availability watcher.
type pathState struct {
	mu        sync.Mutex
	changed   chan struct{} // closed (and replaced) when a path comes up
	downSince time.Time     // when the last path went down; zero while one is up
	expiry    *time.Timer   // reports the replacement timeout's expiry; nil while a path is up

	report      sync.Mutex                        // serializes reports, so the watcher sees them in order
	watcher     func(serving bool, reason string) // under report; nil: nobody watches
	unavailable bool                              // last reported: under report
}

// WatchAvailability registers fn (replacing any earlier one; nil: none) to hear when the device
// can no longer serve — every path down for longer than the replacement timeout, so that I/O
// fails with block.ErrNoPath — and when it serves again because a path came back. Calls are in
// order, from the maintainers' goroutines, and must not block for long. A gateway turns them
// into its lifecycle's failed and ready.
func (d *Device) WatchAvailability(fn func(serving bool, reason string)) {
	d.state.report.Lock()
	d.state.watcher = fn
	d.state.report.Unlock()
}

// reportAvailability tells the watcher when availability changed since its last report.
func (d *Device) reportAvailability() {
	d.state.report.Lock()
	defer d.state.report.Unlock()
	d.state.mu.Lock()
	since := d.state.downSince
	d.state.mu.Unlock()
	rt := d.rec.ReplacementTimeout
	unavailable := !since.IsZero() && rt >= 0 && time.Since(since) >= rt && !d.anyUp() && !d.closed.Load()
	if unavailable == d.state.unavailable || d.state.watcher == nil {
		return
	}
	d.state.unavailable = unavailable
	if unavailable {
		d.state.watcher(false, fmt.Sprintf("no path to the target for %v (replacement timeout): I/O fails", rt))
		return
	}
	d.state.watcher(true, "")
}

// notifyUp wakes every command waiting for a path and reports the device serving again.
func (d *Device) notifyUp() {
	d.state.mu.Lock()
	d.state.downSince = time.Time{}
	if d.state.expiry != nil {
		d.state.expiry.Stop()
		d.state.expiry = nil
	}
	close(d.state.changed)
	d.state.changed = make(chan struct{})
	d.state.mu.Unlock()
	d.reportAvailability()
}

// markDown records when the device lost its last path (the replacement timer's start) and arms
// the report of its expiry.
func (d *Device) markDown(at time.Time) {
	d.state.mu.Lock()
	defer d.state.mu.Unlock()
	if d.anyUp() {
		return
	}
	if d.state.downSince.IsZero() { // else a command waiting for a path saw it first (waitPath)
		d.state.downSince = at
	}
	if rt := d.rec.ReplacementTimeout; rt >= 0 && d.state.expiry == nil {
		d.state.expiry = time.AfterFunc(max(time.Until(d.state.downSince.Add(rt)), 0), d.reportAvailability)
	}
}

func (d *Device) anyUp() bool {
	for _, p := range d.paths {
		if p.up() {
			return true
		}
	}
	return false
}

// waitPath blocks until some path is up, the replacement timeout passes (block.ErrNoPath), the
// device closes or ctx ends.
func (d *Device) waitPath(ctx context.Context) error {
	for {
		d.state.mu.Lock()
		ch := d.state.changed
		if d.anyUp() {
			d.state.mu.Unlock()
			return nil
		}
		if d.state.downSince.IsZero() {
			d.state.downSince = time.Now()
		}
		since := d.state.downSince
		d.state.mu.Unlock()
		if d.closed.Load() {
			return block.ErrClosed
		}
		if err := d.awaitPathChange(ctx, ch, since); err != nil {
			return err
		}
	}
}

// awaitPathChange waits, once, until the path state changes (ch), the replacement timeout
// counted from since runs out, the device closes or ctx ends; only the last and an expired
// timeout are errors. Its timer is stopped on return (a defer in waitPath's loop would keep
// every iteration's timer until waitPath returned).
func (d *Device) awaitPathChange(ctx context.Context, ch <-chan struct{}, since time.Time) error {
	var expire <-chan time.Time
	if rt := d.rec.ReplacementTimeout; rt >= 0 {
		left := time.Until(since.Add(rt))
		if left <= 0 {
			return fmt.Errorf("iser: no session to %s for %v (replacement timeout %v): %w",
				d.info.URL, time.Since(since).Round(time.Millisecond), rt, block.ErrNoPath)
		}
		t := time.NewTimer(left)
		defer t.Stop()
		expire = t.C
	}
	select {
	case <-ch:
	case <-expire:
	case <-d.bgDone():
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

func (d *Device) bgDone() <-chan struct{} {
	if d.bg == nil {
		return nil
	}
	return d.bg.Done()
}

// startRecovery starts a maintainer for every recoverable path.
func (d *Device) startRecovery() {
	d.bg, d.bgCancel = context.WithCancel(context.Background())
	for _, p := range d.paths {
		if p.rec == nil {
			continue
		}
		p.touch()
		d.bgWG.Add(1)
		go d.maintain(p)
	}
}

// stopRecovery ends the maintainers (before the sessions are logged out) and logs each path's
// counters, so an operator sees how the I/O was spread and what outages there were.
func (d *Device) stopRecovery() {
	if d.bgCancel == nil {
		return
	}
	d.bgCancel()
	d.bgWG.Wait()
	for _, st := range d.PathStats() {
		d.log.Info("path stats", zap.String("portal", st.Portal), zap.Bool("up", st.Up), zap.Uint64("commands", st.Commands),
			zap.Uint64("downs", st.Downs), zap.Uint64("restores", st.Restores), zap.Uint64("replayed", st.Replayed),
			zap.Uint64("task_aborts", st.Aborts), zap.Uint64("lun_resets", st.LUNResets))
	}
}

// maintain watches one path for the device's life: keepalive while up, reinstatement while down.
func (d *Device) maintain(p *path) {
	defer d.bgWG.Done()
	log := d.log.With(zap.String("portal", p.name))
	for {
		d.watch(p, log)
		if d.bg.Err() != nil {
			return
		}
		downAt := time.Now()
		p.downs.Add(1)
		d.markDown(downAt)
		log.Warn("path down", zap.Error(p.rec.Err()), zap.Int64("outstanding", p.outstanding.Load()),
			zap.Bool("other_paths_up", d.anyUp()))
		for attempt := 0; ; attempt++ {
			delay := d.rec.backoff(attempt)
			if attempt > 0 {
				log.Info("reconnecting", zap.Duration("in", delay), zap.Int("attempt", attempt+1))
			}
			if !sleepCtx(d.bg, delay) {
				return
			}
			err := p.rec.Login(d.bg)
			if err == nil {
				break
			}
			if d.bg.Err() != nil {
				return
			}
			log.Debug("reconnect attempt failed", zap.Int("attempt", attempt+1), zap.Error(err))
		}
		p.touch()
		p.restores.Add(1)
		log.Info("session restored", zap.Duration("after", time.Since(downAt).Round(time.Millisecond)),
			zap.Int64("commands_to_replay", max(p.pending.Load(), 0)), zap.Uint64("path_commands", p.commands.Load()))
		d.notifyUp()
		d.kickALUA() // the port's group or its state may have changed while it was away
	}
}

// watch returns when the path's connection ends (or the device closes), running the keepalive
// and the command watchdog meanwhile.
func (d *Device) watch(p *path, log *zap.Logger) {
	done := p.rec.Done()
	if done == nil || !p.rec.Connected() {
		return
	}
	tick := time.Second
	if iv := d.rec.NOPInterval; iv > 0 && iv < tick {
		tick = iv
	}
	if ct := d.rec.CommandTimeout; ct > 0 && ct/2 < tick {
		tick = max(ct/2, time.Millisecond)
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-d.bg.Done():
			return
		case <-t.C:
		}
		idle := p.idle()
		if ct := d.rec.CommandTimeout; ct > 0 && p.outstanding.Load() > 0 && idle >= ct {
			if !d.unstick(p, idle, log) {
				return
			}
			continue
		}
		if iv := d.rec.NOPInterval; iv > 0 && idle >= iv {
			ctx, cancel := context.WithTimeout(d.bg, d.rec.NOPTimeout)
			sent := time.Now()
			err := p.rec.Ping(ctx, nil)
			cancel()
			switch {
			case err == nil:
				p.nop.record(time.Since(sent))
				p.touch()
			case d.bg.Err() != nil:
				return
			case p.rec.Connected():
				err = fmt.Errorf("keepalive: no NOP-In within %v (%v): %w", d.rec.NOPTimeout, err, block.ErrTimeout)
				log.Warn("dropping the connection", zap.Error(err))
				p.rec.Drop(err)
				return
			default:
				return // the connection ended during the ping
			}
		}
	}
}

// unstick runs the next escalation step for a path whose commands made no progress for idle. It
// returns false when it dropped the connection.
func (d *Device) unstick(p *path, idle time.Duration, log *zap.Logger) bool {
	n := p.outstanding.Load()
	tm, _ := p.ex.(taskManager)
	step := int(p.escalation.Load())
	if tm == nil {
		step = escDrop
	}
	tmfTimeout := max(d.rec.NOPTimeout, 5*time.Second)
	log = log.With(zap.Int64("outstanding", n), zap.Duration("no_completion_for", idle.Round(time.Millisecond)))
	if step <= escAbort {
		ctx, cancel := context.WithTimeout(d.bg, tmfTimeout)
		aborted, err := tm.AbortOutstanding(ctx)
		cancel()
		if err == nil {
			log.Warn("command timeout: stuck commands aborted (ABORT TASK); re-issuing them", zap.Int("aborted", aborted))
			p.aborts.Add(1)
			p.escalation.Store(escReset)
			p.touch()
			return true
		}
		log.Warn("command timeout: ABORT TASK failed; escalating to LOGICAL UNIT RESET", zap.Error(err))
		step = escReset
	}
	if step <= escReset && d.bg.Err() == nil {
		ctx, cancel := context.WithTimeout(d.bg, tmfTimeout)
		err := tm.ResetLUN(ctx, d.lun)
		cancel()
		if err == nil {
			log.Warn("command timeout: LOGICAL UNIT RESET ended the stuck commands; re-issuing them")
			p.lunResets.Add(1)
			p.escalation.Store(escDrop)
			p.touch()
			return true
		}
		log.Warn("command timeout: LOGICAL UNIT RESET failed; dropping the connection", zap.Error(err))
	}
	err := fmt.Errorf("command timeout: %d commands outstanding, none completed for %v: %w",
		n, idle.Round(time.Millisecond), block.ErrTimeout)
	log.Warn("dropping the connection", zap.Error(err))
	p.escalation.Store(escAbort)
	p.rec.Drop(err)
	return false
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
