package iser

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/iser-blk/iser-blk/backend/iser/internal/session"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/backend/iser/scsi/scsitest"
	"github.com/iser-blk/iser-blk/block"
)

// fakeSession is a recoverableExecutor over a scsitest LUN whose connection the test controls:
// kill it (outstanding commands fail with a ConnError), refuse logins, make pings or commands hang.
type fakeSession struct {
	lun *scsitest.LUN

	mu      sync.Mutex
	done    chan struct{} // current connection; nil when never logged in
	err     error
	refuse  atomic.Bool // Login fails
	silent  atomic.Bool // Ping never answers (a silent partition)
	hang    atomic.Bool // commands never complete until the connection dies
	logins  atomic.Int64
	execs   atomic.Int64
	hanging atomic.Int64
	ended   chan struct{} // closed to end the hanging commands as a confirmed TMF would
	order   []uint64      // LBAs of the WRITE(16)s executed, in order (under mu)
}

func newFakeSession(lun *scsitest.LUN) *fakeSession {
	f := &fakeSession{lun: lun, done: make(chan struct{}), ended: make(chan struct{})}
	return f
}

func (f *fakeSession) conn() (chan struct{}, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.done, f.err
}

func (f *fakeSession) Connected() bool {
	done, _ := f.conn()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

func (f *fakeSession) Done() <-chan struct{} {
	done, _ := f.conn()
	if done == nil {
		return nil
	}
	return done
}

func (f *fakeSession) Err() error { _, err := f.conn(); return err }

func (f *fakeSession) Drop(cause error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done == nil {
		return
	}
	select {
	case <-f.done:
	default:
		f.err = cause
		close(f.done)
	}
}

func (f *fakeSession) Login(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if f.refuse.Load() {
		return errors.New("connection refused")
	}
	if f.Connected() {
		return nil
	}
	f.mu.Lock()
	f.done, f.err = make(chan struct{}), nil
	f.mu.Unlock()
	f.hang.Store(false) // a new connection: the stuck commands are gone with the old one
	f.logins.Add(1)
	return nil
}

func (f *fakeSession) Ping(ctx context.Context, _ []byte) error {
	done, err := f.conn()
	if !f.silent.Load() {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-done:
		return f.Err()
	}
}

func (f *fakeSession) Execute(ctx context.Context, cmd *scsi.Command, resp *scsi.Response) error {
	f.execs.Add(1)
	done, _ := f.conn()
	lost := func() error {
		return &session.ConnError{Target: "fake", Portal: "fake:3260", Err: f.Err()}
	}
	if !f.Connected() {
		return lost()
	}
	if f.hang.Load() && cmd.CDB[0] != scsi.OpInquiry {
		f.hanging.Add(1)
		defer f.hanging.Add(-1)
		f.mu.Lock()
		ended := f.ended
		f.mu.Unlock()
		select {
		case <-ended:
			return &session.TaskError{Reason: "ended by task management", Err: session.ErrTaskAborted}
		case <-done:
			return lost()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if cmd.CDB[0] == scsi.OpWrite16 {
		f.mu.Lock()
		f.order = append(f.order, binary.BigEndian.Uint64(cmd.CDB[2:10]))
		f.mu.Unlock()
	}
	return f.lun.Execute(ctx, cmd, resp)
}

// kill ends the connection as a transport error would.
func (f *fakeSession) kill() { f.Drop(errors.New("connection reset by peer")) }

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

func fastRecovery() Recovery {
	return Recovery{ReplacementTimeout: -1, ReconnectMin: time.Millisecond, ReconnectMax: 5 * time.Millisecond}
}

func recoveringDevice(t *testing.T, rec Recovery, sessions ...*fakeSession) *Device {
	t.Helper()
	execs := make([]scsi.Executor, len(sessions))
	for i, s := range sessions {
		execs[i] = s
	}
	d, err := NewDevice(context.Background(), execs, 0, Options{Recovery: &rec, Logger: zaptest.NewLogger(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestReplayAfterReinstatement: writes in flight when the connection dies are re-issued after
// the session is reinstated; every write lands; the counters show the outage.
func TestReplayAfterReinstatement(t *testing.T) {
	lun := scsitest.New(scsitest.Config{MaxTransferBlocks: 16})
	s := newFakeSession(lun)
	d := recoveringDevice(t, fastRecovery(), s)
	ctx := context.Background()

	s.hang.Store(true)
	s.refuse.Store(true)
	const n = 8
	data := randBytes(n * 8192)
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- d.WriteAt(ctx, data[i*8192:(i+1)*8192], int64(i*8192), 0) }()
	}
	waitFor(t, "all writes in flight", 5*time.Second, func() bool { return s.hanging.Load() == n })
	s.kill()
	waitFor(t, "path down", 5*time.Second, func() bool { return d.PathStats()[0].Downs == 1 })
	waitFor(t, "the dead connection's commands to return", 5*time.Second, func() bool { return s.hanging.Load() == 0 })
	s.refuse.Store(false)
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("write across a reconnect: %v", err)
		}
	}
	if got := lun.Bytes(0, int64(len(data))); !bytes.Equal(got, data) {
		t.Fatal("data written across a reconnect differs")
	}
	waitFor(t, "restore counted", 5*time.Second, func() bool { return d.PathStats()[0].Restores == 1 })
	st := d.PathStats()[0]
	if !st.Up || st.Restores != 1 || st.Replayed < n {
		t.Fatalf("path stats after one outage: %+v", st)
	}
}

// TestReplacementTimeout: with no path, I/O waits at most the replacement timeout, then it and
// every new request fail with ErrNoPath (EIO) at once; when the session is back, I/O works.
func TestReplacementTimeout(t *testing.T) {
	for _, tc := range []struct {
		name string
		rt   time.Duration
	}{{"fails at once", 0}, {"bounded", 150 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			lun := scsitest.New(scsitest.Config{})
			s := newFakeSession(lun)
			rec := fastRecovery()
			rec.ReplacementTimeout = tc.rt
			d := recoveringDevice(t, rec, s)
			ctx := context.Background()
			buf := make([]byte, 4096)

			s.refuse.Store(true)
			s.kill()
			start := time.Now()
			err := d.ReadAt(ctx, buf, 0)
			took := time.Since(start)
			if !errors.Is(err, block.ErrNoPath) {
				t.Fatalf("read with no path: %v", err)
			}
			if took < tc.rt-10*time.Millisecond || took > tc.rt+2*time.Second {
				t.Fatalf("read failed after %v, replacement timeout %v", took, tc.rt)
			}
			start = time.Now()
			if err := d.WriteAt(ctx, buf, 0, 0); !errors.Is(err, block.ErrNoPath) || time.Since(start) > time.Second {
				t.Fatalf("new write after the replacement timeout: %v after %v", err, time.Since(start))
			}
			s.refuse.Store(false)
			waitFor(t, "path back", 5*time.Second, func() bool { return d.PathStats()[0].Up })
			if err := d.ReadAt(ctx, buf, 0); err != nil {
				t.Fatalf("read after the session came back: %v", err)
			}
		})
	}
	t.Run("negative waits", func(t *testing.T) {
		lun := scsitest.New(scsitest.Config{})
		s := newFakeSession(lun)
		d := recoveringDevice(t, fastRecovery(), s) // ReplacementTimeout -1
		s.refuse.Store(true)
		s.kill()
		errc := make(chan error, 1)
		go func() { errc <- d.ReadAt(context.Background(), make([]byte, 512), 0) }()
		waitFor(t, "reconnect attempts", 5*time.Second, func() bool { return d.PathStats()[0].Downs == 1 })
		select {
		case err := <-errc:
			t.Fatalf("read returned while the path was down and the timeout is infinite: %v", err)
		default:
		}
		s.refuse.Store(false)
		if err := <-errc; err != nil {
			t.Fatalf("queued read after the path came back: %v", err)
		}
	})
}

// TestKeepaliveDropsSilentConnection: pings that go unanswered drop the connection, which is
// then reinstated.
func TestKeepaliveDropsSilentConnection(t *testing.T) {
	s := newFakeSession(scsitest.New(scsitest.Config{}))
	rec := fastRecovery()
	rec.NOPInterval, rec.NOPTimeout = 20*time.Millisecond, 30*time.Millisecond
	d := recoveringDevice(t, rec, s)
	s.silent.Store(true)
	s.refuse.Store(true)
	start := time.Now()
	waitFor(t, "keepalive to drop the connection", 5*time.Second, func() bool { return d.PathStats()[0].Downs == 1 })
	if took := time.Since(start); took > time.Second {
		t.Fatalf("silent connection detected after %v", took)
	}
	if err := s.Err(); !errors.Is(err, block.ErrTimeout) {
		t.Fatalf("drop cause: %v", err)
	}
	s.silent.Store(false)
	s.refuse.Store(false)
	waitFor(t, "reinstatement", 5*time.Second, func() bool { return d.PathStats()[0].Restores == 1 })
}

// TestCommandTimeoutDropsStuckPath: commands outstanding with no completion for the command
// timeout drop the connection; they are re-issued on the new one and succeed.
func TestCommandTimeoutDropsStuckPath(t *testing.T) {
	lun := scsitest.New(scsitest.Config{})
	s := newFakeSession(lun)
	rec := fastRecovery()
	rec.CommandTimeout = 100 * time.Millisecond
	d := recoveringDevice(t, rec, s)
	s.hang.Store(true)
	data := randBytes(4096)
	start := time.Now()
	if err := d.WriteAt(context.Background(), data, 8192, 0); err != nil {
		t.Fatalf("write on a stuck path: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("stuck write took %v with a 100 ms command timeout", took)
	}
	if err := s.Err(); err != nil && !errors.Is(err, block.ErrTimeout) {
		t.Fatalf("drop cause: %v", err)
	}
	if !bytes.Equal(lun.Bytes(8192, 4096), data) {
		t.Fatal("re-issued write did not land")
	}
	if st := d.PathStats()[0]; st.Downs != 1 || st.Replayed != 1 {
		t.Fatalf("stats: %+v", st)
	}
}

// TestFailoverAndFailback: one of two paths dies under load: no request fails; when it is back,
// commands go to both again.
func TestFailoverAndFailback(t *testing.T) {
	lun := scsitest.New(scsitest.Config{MaxTransferBlocks: 8})
	a, b := newFakeSession(lun), newFakeSession(lun)
	d := recoveringDevice(t, fastRecovery(), a, b)
	ctx := context.Background()
	data := randBytes(256 << 10)
	if err := d.WriteAt(ctx, data, 0, 0); err != nil {
		t.Fatal(err)
	}
	a.refuse.Store(true)
	a.kill()
	before := d.PathStats()
	got := make([]byte, len(data))
	for i := range 8 {
		if err := d.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read %d with one path down: %v", i, err)
		}
	}
	mid := d.PathStats()
	if mid[0].Commands != before[0].Commands || mid[1].Commands <= before[1].Commands {
		t.Fatalf("with path a down, commands went: before %+v after %+v", before, mid)
	}
	a.refuse.Store(false)
	waitFor(t, "fail-back", 5*time.Second, func() bool { return d.PathStats()[0].Up })
	for range 8 {
		if err := d.ReadAt(ctx, got, 0); err != nil {
			t.Fatal(err)
		}
	}
	after := d.PathStats()
	if after[0].Commands == mid[0].Commands || after[1].Commands == mid[1].Commands {
		t.Fatalf("after fail-back, traffic is not on both paths: %+v -> %+v", mid, after)
	}
	t.Logf("path counters: %+v", after)
}

func TestBackoff(t *testing.T) {
	r := Recovery{ReconnectMin: 100 * time.Millisecond, ReconnectMax: time.Second}
	if d := r.backoff(0); d != 0 {
		t.Fatalf("first attempt delayed %v", d)
	}
	for n, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 10: time.Second, 60: time.Second} {
		for range 20 {
			d := r.backoff(n)
			if d < want*8/10 || d > want*12/10 {
				t.Fatalf("backoff(%d) = %v, want %v ±20%%", n, d, want)
			}
		}
	}
}

// tmSession is a fakeSession whose target answers task management: ABORT TASK and LOGICAL UNIT
// RESET each work (ending the hanging commands and un-sticking the target) or go unanswered.
type tmSession struct {
	*fakeSession
	abortOK, resetOK bool
	aborts, resets   atomic.Int64
}

func (s *tmSession) end(ok bool) error {
	if !ok {
		return errors.New("TMF unanswered")
	}
	s.hang.Store(false)
	s.mu.Lock()
	close(s.ended)
	s.ended = make(chan struct{})
	s.mu.Unlock()
	return nil
}

func (s *tmSession) AbortOutstanding(context.Context) (int, error) {
	s.aborts.Add(1)
	n := int(s.hanging.Load())
	return n, s.end(s.abortOK)
}

func (s *tmSession) ResetLUN(context.Context, uint64) error {
	s.resets.Add(1)
	return s.end(s.resetOK)
}

// TestCommandTimeoutEscalation: stuck commands are ended by ABORT TASK when the target confirms
// it; else by LOGICAL UNIT RESET; else the connection is dropped. In every case the write is
// re-issued and lands.
func TestCommandTimeoutEscalation(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		abortOK, resetOK       bool
		aborts, resets, downs  int64
		statAborts, statResets uint64
	}{
		{"abort task", true, false, 1, 0, 0, 1, 0},
		{"lun reset", false, true, 1, 1, 0, 0, 1},
		{"drop", false, false, 1, 1, 1, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lun := scsitest.New(scsitest.Config{})
			s := &tmSession{fakeSession: newFakeSession(lun), abortOK: tc.abortOK, resetOK: tc.resetOK}
			rec := fastRecovery()
			rec.CommandTimeout = 100 * time.Millisecond
			rec.NOPTimeout = 50 * time.Millisecond
			d, err := NewDevice(context.Background(), []scsi.Executor{s}, 0,
				Options{Recovery: &rec, Logger: zaptest.NewLogger(t)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Close() })
			s.hang.Store(true)
			data := randBytes(4096)
			if err := d.WriteAt(context.Background(), data, 4096, 0); err != nil {
				t.Fatalf("stuck write: %v", err)
			}
			if !bytes.Equal(lun.Bytes(4096, 4096), data) {
				t.Fatal("the re-issued write did not land")
			}
			// The watchdog counts its step after the TMF returns, the re-issued write may be faster.
			waitFor(t, "escalation counters", 5*time.Second, func() bool {
				st := d.PathStats()[0]
				return st.Aborts+st.LUNResets+st.Downs > 0
			})
			st := d.PathStats()[0]
			if s.aborts.Load() != tc.aborts || s.resets.Load() != tc.resets || int64(st.Downs) != tc.downs ||
				st.Aborts != tc.statAborts || st.LUNResets != tc.statResets || st.Replayed != 1 {
				t.Fatalf("aborts %d resets %d stats %+v", s.aborts.Load(), s.resets.Load(), st)
			}
		})
	}
}

// steadySession is a recoverableExecutor that is always up (for the allocation test).
type steadySession struct {
	*scsitest.LUN
	done chan struct{}
}

func (s steadySession) Connected() bool                    { return true }
func (s steadySession) Login(context.Context) error        { return nil }
func (s steadySession) Done() <-chan struct{}              { return s.done }
func (s steadySession) Err() error                         { return nil }
func (s steadySession) Ping(context.Context, []byte) error { return nil }
func (s steadySession) Drop(error)                         {}

// TestRecoveringHotPathAllocatesNothing: the path-aware command loop (recoverable sessions,
// several paths) allocates nothing per request.
func TestRecoveringHotPathAllocatesNothing(t *testing.T) {
	lun := scsitest.New(scsitest.Config{})
	a := steadySession{LUN: lun, done: make(chan struct{})}
	b := steadySession{LUN: lun, done: make(chan struct{})}
	rec := fastRecovery()
	d, err := NewDevice(context.Background(), []scsi.Executor{a, b}, 0, Options{Recovery: &rec}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	ctx := context.Background()
	buf := make([]byte, 4096)
	_ = d.WriteAt(ctx, buf, 0, 0)
	allocs := testing.AllocsPerRun(200, func() {
		if err := d.WriteAt(ctx, buf, 0, 0); err != nil {
			t.Fatal(err)
		}
		if err := d.ReadAt(ctx, buf, 0); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("ReadAt+WriteAt allocate %v times per call pair over recoverable paths", allocs)
	}
}

// TestReplayInArrivalOrder: commands failed by a connection loss are re-issued oldest first, one
// after another, and a command arriving during the outage goes after all of them.
func TestReplayInArrivalOrder(t *testing.T) {
	lun := scsitest.New(scsitest.Config{})
	s := newFakeSession(lun)
	d := recoveringDevice(t, fastRecovery(), s)
	ctx := context.Background()
	buf := make([]byte, 512)
	const n = 8
	s.hang.Store(true)
	errs := make(chan error, n+1)
	for i := range n {
		go func() { errs <- d.WriteAt(ctx, buf, int64(i)*512, 0) }()
		waitFor(t, "write in flight", 5*time.Second, func() bool { return s.hanging.Load() == int64(i+1) })
	}
	s.refuse.Store(true)
	s.kill()
	waitFor(t, "replays queued", 5*time.Second, func() bool { return d.replays.n.Load() == n })
	go func() { errs <- d.WriteAt(ctx, buf, 100*512, 0) }() // arrives during the outage
	waitFor(t, "the new write to queue behind the replays", 5*time.Second, func() bool { return d.seq.Load() >= n+1 })
	s.mu.Lock()
	s.order = nil
	s.mu.Unlock()
	s.refuse.Store(false)
	for range n + 1 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	want := []uint64{0, 1, 2, 3, 4, 5, 6, 7, 100}
	if fmt.Sprint(s.order) != fmt.Sprint(want) {
		t.Fatalf("re-issue order %v, want %v", s.order, want)
	}
}
