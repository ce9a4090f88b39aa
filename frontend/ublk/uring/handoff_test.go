package uring

import (
	"bytes"
	"fmt"
	"runtime"
	"runtime/trace"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/internal/blockcall/blockcalltest"
)

// TestWaitHandsOffP: a wait that hands the P off releases it from the waiting thread itself,
// before the thread blocks in the kernel; a wait that keeps it does not (sysmon takes it later,
// from its own thread). At GOMAXPROCS=1 the goroutine that ends each wait (a pipe write) can
// run only once the P is free, so the two modes differ in an order of events, which the
// runtime's execution trace records (package blockcalltest), not in a timing:
//   - hand-off: in every round, the waiting thread's "P running → idle" comes after its
//     goroutine's system call began and before the write;
//   - keep: in no round does the waiting thread release the P before the write (it is inside
//     io_uring_enter until then).
//
// TestWaitOnOneP checks the data of both modes; this one is what fails if the hand-off breaks.
func TestWaitHandsOffP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keepP=%v", keep), func(t *testing.T) {
			// A round counts when the writer ran after the wait entered the kernel, which is the
			// rule (a channel send leaves the receiver queued and the sender running) but not a
			// promise: require a tenth of the rounds.
			const rounds, minWaited = 50, 5
			rs := traceWaits(t, keep, rounds)
			waited, released := 0, 0
			for i, r := range rs {
				if !r.Marked || !r.InSyscall {
					continue // the write came before the wait entered the kernel: nothing to tell
				}
				waited++
				if r.Released {
					released++
				}
				if r.Released == keep {
					t.Errorf("round %d: the waiting thread released its P before the write: %v, want %v", i, r.Released, !keep)
				}
			}
			t.Logf("%d of %d writes found the reader inside io_uring_enter; in %d its thread had released its P", waited, rounds, released)
			if waited < minWaited {
				t.Fatalf("only %d of %d writes found their reader inside io_uring_enter", waited, rounds)
			}
		})
	}
}

// traceWaits runs rounds of "a locked thread waits in SubmitAndWait for a pipe read, another
// goroutine writes the pipe" under the execution tracer and returns what each round's events say.
func traceWaits(t *testing.T, keep bool, rounds int) []blockcalltest.Round {
	t.Helper()
	r := newRing(t, 4, 0)
	r.SetWaitKeepsP(keep)
	p := newPipe(t)
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Skipf("the execution tracer is in use: %v", err) // go test -trace
	}
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		b := make([]byte, 1)
		for i := range rounds {
			PrepRead(r.GetSQE(), p[0], b, -1, uint64(i))
			ready <- struct{}{} // the writer is readied; this goroutine goes on to wait
			blockcalltest.Begin(i)
			if _, err := r.SubmitAndWait(1); err != nil {
				done <- err
				return
			}
			r.SeenCQE()
		}
		done <- nil
	}()
	for i := range rounds {
		<-ready
		blockcalltest.End(i)
		if _, err := unix.Write(p[1], []byte{1}); err != nil {
			t.Fatal(err)
		}
	}
	err := <-done
	trace.Stop()
	if err != nil {
		t.Fatal(err)
	}
	rs, err := blockcalltest.Rounds(&buf, rounds)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}
