// Package blockcalltest tells from the Go runtime's execution trace whether a system call handed
// its thread's P off (package blockcall) or kept it: a property of event order, not of timing,
// so tests may assert it.
//
// A test marks a window per round with runtime/trace.Log: Begin(i) on the goroutine under test,
// just before its call, and End(i) on any goroutine. Rounds then reports, per round, whether that
// goroutine was in a system call at End, and whether its own thread released the P (running →
// idle) after the call began and before End. A call that hands the P off does so from its own
// thread at once; a kept P is only ever taken by sysmon, from another thread, or given up by the
// thread after the call returned.
package blockcalltest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"runtime"
	"runtime/trace"
	"strconv"
	"testing"

	xtrace "golang.org/x/exp/trace"
)

const (
	beginCategory = "blockcalltest.begin"
	endCategory   = "blockcalltest.end"
)

// Begin marks the start of round i on the calling goroutine, the one whose call is judged.
func Begin(i int) { trace.Log(context.Background(), beginCategory, strconv.Itoa(i)) }

// End marks the end of round i.
func End(i int) { trace.Log(context.Background(), endCategory, strconv.Itoa(i)) }

// Round is what the trace shows of one round.
type Round struct {
	Marked    bool // both marks were found
	Entered   bool // the goroutine entered a system call in the window
	InSyscall bool // it was in a system call at End
	Released  bool // its thread released its P while it was in that call
}

// Rounds reads a trace (runtime/trace.Start's output) with marks for rounds 0..n-1.
func Rounds(tr io.Reader, n int) ([]Round, error) {
	rd, err := xtrace.NewReader(tr)
	if err != nil {
		return nil, err
	}
	rs := make([]Round, n)
	var cur *Round
	g, thread := xtrace.NoGoroutine, xtrace.NoThread
	for {
		ev, err := rd.ReadEvent()
		if errors.Is(err, io.EOF) {
			return rs, nil
		}
		if err != nil {
			return nil, err
		}
		switch ev.Kind() {
		case xtrace.EventLog:
			l := ev.Log()
			i, err := strconv.Atoi(l.Message)
			if err != nil || i < 0 || i >= n {
				continue
			}
			switch l.Category {
			case beginCategory:
				rs[i] = Round{}
				cur, g, thread = &rs[i], ev.Goroutine(), ev.Thread()
			case endCategory:
				if cur == &rs[i] {
					cur.Marked = true
				}
				cur = nil // later events belong to no round until the next Begin
			}
		case xtrace.EventStateTransition:
			if cur == nil {
				continue
			}
			st := ev.StateTransition()
			switch st.Resource.Kind {
			case xtrace.ResourceGoroutine:
				if st.Resource.Goroutine() == g {
					_, to := st.Goroutine()
					cur.InSyscall = to == xtrace.GoSyscall
					cur.Entered = cur.Entered || cur.InSyscall
				}
			case xtrace.ResourceProc:
				// The thread holds the P it releases: a thread back from a call whose P was
				// taken shows up with no P of its own.
				if _, to := st.Proc(); cur.InSyscall && to == xtrace.ProcIdle && ev.Thread() == thread && ev.Proc() != xtrace.NoProc {
					cur.Released = true
				}
			}
		}
	}
}

// Waits is a test of rounds of "a goroutine waits in a system call until another goroutine wakes
// it", run by Run at GOMAXPROCS=1 under the execution tracer.
type Waits struct {
	Rounds     int
	LockThread bool              // the waiting goroutine runs locked to its thread (a ring's owner)
	Wait       func(i int) error // round i's wait: blocks in a system call until Wake(i)
	Wake       func(i int) error // ends round i's wait
}

// Run runs w and returns what the trace shows of each round: Begin is marked just before Wait,
// End just before Wake. At one P the waker runs after the waiter has entered its call, as a rule
// (a channel send leaves the receiver queued and the sender running) but not a promise; Expect
// counts only the rounds where it did. It skips the test when the tracer is already in use.
func Run(t testing.TB, w Waits) []Round {
	t.Helper()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var tr bytes.Buffer
	if err := trace.Start(&tr); err != nil {
		t.Skipf("the execution tracer is in use: %v", err) // go test -trace
	}
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		if w.LockThread {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
		}
		for i := range w.Rounds {
			ready <- struct{}{} // the waker is readied; this goroutine goes on to wait
			Begin(i)
			if err := w.Wait(i); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	var wakeErr error
	for i := range w.Rounds {
		<-ready
		End(i)
		if wakeErr = w.Wake(i); wakeErr != nil {
			break
		}
	}
	err := wakeErr
	if err == nil {
		err = <-done
	}
	trace.Stop()
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Rounds(&tr, w.Rounds)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// Expect fails t unless, in every round whose waker found the waiter in its call (at least
// minWaited of them), the waiter's thread released its P exactly when handOff says.
func Expect(t testing.TB, rs []Round, handOff bool, minWaited int) {
	t.Helper()
	waited := 0
	for i, r := range rs {
		if !r.Marked || !r.InSyscall {
			continue // the waker ran before the wait entered the kernel: nothing to tell
		}
		waited++
		if r.Released != handOff {
			t.Errorf("round %d: the waiting thread released its P in its call: %v, want %v", i, r.Released, handOff)
		}
	}
	if waited < minWaited {
		t.Fatalf("only %d of %d wakes found the waiter in its call, want at least %d", waited, len(rs), minWaited)
	}
}
