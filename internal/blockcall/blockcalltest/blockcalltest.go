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
	"context"
	"errors"
	"io"
	"strconv"

	"runtime/trace"

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
