package uring

import (
	"fmt"
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
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keepP=%v", keep), func(t *testing.T) {
			r := newRing(t, 4, 0)
			r.SetWaitKeepsP(keep)
			p := newPipe(t)
			b := make([]byte, 1)
			rs := blockcalltest.Run(t, blockcalltest.Waits{Rounds: 50, LockThread: true, // a ring's owner
				Wait: func(i int) error {
					PrepRead(r.GetSQE(), p[0], b, -1, uint64(i))
					if _, err := r.SubmitAndWait(1); err != nil {
						return err
					}
					if cqe := r.PeekCQE(); cqe == nil || cqe.UserData != uint64(i) || cqe.Res != 1 {
						return fmt.Errorf("round %d: cqe %+v", i, cqe)
					}
					r.SeenCQE()
					return nil
				},
				Wake: func(int) error { _, err := unix.Write(p[1], []byte{1}); return err },
			})
			blockcalltest.Expect(t, rs, !keep, 5)
		})
	}
}
