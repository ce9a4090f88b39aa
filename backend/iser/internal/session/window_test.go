package session

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

// TestUpdateWindow: ExpCmdSN/MaxCmdSN only move forward (serial arithmetic, across 2^32) and a
// pair with MaxCmdSN < ExpCmdSN-1 is ignored (RFC 7143 §4.2.2.1).
func TestUpdateWindow(t *testing.T) {
	tests := []struct {
		name               string
		exp0, max0         uint32
		exp, maxSN         uint32
		wantExp, wantMaxSN uint32
	}{
		{"advance", 5, 10, 6, 20, 6, 20},
		{"backwards ignored", 5, 10, 4, 8, 5, 10},
		{"invalid pair ignored", 5, 10, 30, 20, 5, 10},
		{"closed window accepted", 5, 10, 11, 10, 11, 10},
		{"wrap", 0xfffffff0, 0xfffffffe, 0xfffffff8, 0x10, 0xfffffff8, 0x10},
		{"wrap backwards ignored", 0x5, 0x10, 0xfffffff0, 0xfffffff8, 0x5, 0x10},
	}
	for _, tt := range tests {
		c := &conn{}
		c.expCmdSN.Store(tt.exp0)
		c.maxCmdSN.Store(tt.max0)
		var b pdu.BHS
		pdu.EncodeNOPIn(&b, 0, 0, pdu.ReservedTag, pdu.ReservedTag, pdu.TargetHeader{ExpCmdSN: tt.exp, MaxCmdSN: tt.maxSN})
		c.updateWindow(&b)
		if c.expCmdSN.Load() != tt.wantExp || c.maxCmdSN.Load() != tt.wantMaxSN {
			t.Errorf("%s: ExpCmdSN %#x MaxCmdSN %#x, want %#x %#x", tt.name, c.expCmdSN.Load(), c.maxCmdSN.Load(), tt.wantExp, tt.wantMaxSN)
		}
	}
}

// TestCmdSNWrap runs commands across the 2^32 CmdSN wrap against the fake target.
func TestCmdSNWrap(t *testing.T) {
	d := &pipeDialer{}
	f := newFake(t, d, "fake:3260", nil)
	f.expCmdSN, f.maxCmdSN, f.window = 0xfffffffd, 0xfffffffd, 2
	var seen []uint32
	done := f.serve(func(f *fakeTarget, p wirePDU) error {
		switch p.bhs.Opcode() {
		case pdu.OpSCSICommand:
			seen = append(seen, p.bhs.CmdSN())
			return f.respond(p.bhs.ITT(), 0, nil, 0, 0)
		case pdu.OpLogoutReq:
			return logoutOK(f, &p.bhs)
		}
		return nil
	})
	s := newTestSession(t, d, nil)
	mustLogin(t, s)
	for i := 0; i < 6; i++ {
		var resp scsi.Response
		if err := s.Execute(context.Background(), tur(), &resp); err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
	}
	s.Close()
	<-done
	want := []uint32{0xfffffffd, 0xfffffffe, 0xffffffff, 0, 1, 2}
	for i := range want {
		if i >= len(seen) || seen[i] != want[i] {
			t.Fatalf("CmdSNs %#x, want %#x", seen, want)
		}
	}
}

// TestUnsolicitedTargetPDUs: an unsolicited NOP-In that wants no answer and SCSI asynchronous
// events are absorbed; commands go on.
func TestUnsolicitedTargetPDUs(t *testing.T) {
	d := &pipeDialer{}
	f := newFake(t, d, "fake:3260", nil)
	var nopOuts int
	done := f.serve(func(f *fakeTarget, p wirePDU) error {
		switch p.bhs.Opcode() {
		case pdu.OpSCSICommand:
			var r pdu.BHS
			pdu.EncodeNOPIn(&r, 0, 0, pdu.ReservedTag, pdu.ReservedTag, f.sns())
			if err := f.write(&r, nil); err != nil {
				return err
			}
			sense := []byte{0, 18, 0x70, 0, 6, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x2a, 0x09, 0, 0, 0, 0}
			pdu.EncodeAsyncMessage(&r, len(sense), 1<<48, f.sns(), 0, 0, 0, 0, 0)
			f.statSN++
			if err := f.write(&r, sense); err != nil {
				return err
			}
			return f.respond(p.bhs.ITT(), 0, nil, 0, 0)
		case pdu.OpNOPOut:
			nopOuts++
		case pdu.OpLogoutReq:
			return logoutOK(f, &p.bhs)
		}
		return nil
	})
	s := newTestSession(t, d, nil)
	mustLogin(t, s)
	for i := 0; i < 3; i++ {
		var resp scsi.Response
		if err := s.Execute(context.Background(), tur(), &resp); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	<-done
	if nopOuts != 0 {
		t.Fatalf("%d NOP-Outs answered a NOP-In that wanted none", nopOuts)
	}
}

// TestLoginAndPingTimeouts: a target that never answers fails the login within LoginTimeout
// with an error naming the target; a ping without answer honours its context.
func TestLoginAndPingTimeouts(t *testing.T) {
	d := &pipeDialer{}
	f := newFake(t, d, "fake:3260", nil)
	go func() {
		for {
			if _, err := f.read(); err != nil {
				return
			}
		}
	}()
	s := newTestSession(t, d, func(c *Config) { c.LoginTimeout = 100 * time.Millisecond })
	start := time.Now()
	err := s.Login(context.Background())
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "iqn.2026-11.io.iser-blk:fake") {
		t.Fatalf("login to a silent target: %v", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("login timeout took %v", time.Since(start))
	}

	d2 := &pipeDialer{}
	f2 := newFake(t, d2, "fake:3260", nil)
	done := f2.serve(func(f *fakeTarget, p wirePDU) error {
		if p.bhs.Opcode() == pdu.OpLogoutReq {
			return logoutOK(f, &p.bhs)
		}
		return nil // pings go unanswered
	})
	s2 := newTestSession(t, d2, func(c *Config) { c.Proposal = login.DefaultProposal() })
	mustLogin(t, s2)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s2.Ping(ctx, []byte("x")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("unanswered ping: %v", err)
	}
	s2.Close()
	<-done
}

// TestWindowWakesWaitersInOrder: commands waiting for a closed CmdSN window are let in first
// come first, one per slot the target opens; the others go on waiting without being woken. A
// waiter that gives up leaves the queue, and a wake-up it got as it gave up goes to the next.
func TestWindowWakesWaitersInOrder(t *testing.T) {
	c := &conn{done: make(chan struct{})}
	c.cmdSN = 11
	c.maxCmdSN.Store(10) // closed: the next CmdSN is beyond MaxCmdSN
	const n = 4
	tasks := make([]task, n)
	ctxs := make([]context.Context, n)
	cancels := make([]context.CancelFunc, n)
	in := make(chan int, n)
	errs := make(chan error, n)
	for i := range tasks {
		tasks[i].win = make(chan struct{}, 1)
		ctxs[i], cancels[i] = context.WithCancel(context.Background())
		defer cancels[i]()
		go func() {
			if err := c.waitWindow(ctxs[i], &tasks[i]); err != nil {
				errs <- err
				return
			}
			c.cmdSN++ // the command is sent: its slot is taken
			c.sendMu.Unlock()
			in <- i
		}()
		waitFor(t, func() bool { return windowQueueLen(c) == i+1 }) // queue in a known order
	}
	advance := func(maxSN uint32) {
		var b pdu.BHS
		pdu.EncodeNOPIn(&b, 0, 0, pdu.ReservedTag, pdu.ReservedTag, pdu.TargetHeader{ExpCmdSN: 11, MaxCmdSN: maxSN})
		c.updateWindow(&b)
	}
	// One slot: the first waiter, only.
	advance(11)
	if got := <-in; got != 0 {
		t.Fatalf("waiter %d got the first slot, want 0", got)
	}
	if q := windowQueueLen(c); q != n-1 {
		t.Fatalf("%d waiters queued after one slot opened, want %d", q, n-1)
	}
	// The second waiter gives up: it leaves the queue.
	cancels[1]()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	if q := windowQueueLen(c); q != n-2 {
		t.Fatalf("%d waiters queued after one gave up, want %d", q, n-2)
	}
	// Two slots: the third and the fourth.
	advance(13)
	if a, b := <-in, <-in; a+b != 5 {
		t.Fatalf("waiters %d and %d got two slots, want 2 and 3", a, b)
	}
	if q, w := windowQueueLen(c), c.winWaiters.Load(); q != 0 || w != 0 {
		t.Fatalf("queue %d, waiters %d after everyone got in", q, w)
	}
}

func windowQueueLen(c *conn) int {
	c.winMu.Lock()
	defer c.winMu.Unlock()
	return len(c.winQ)
}

// waitFor polls cond until it holds, for at most 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}
