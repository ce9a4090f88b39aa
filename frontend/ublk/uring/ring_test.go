package uring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func newRing(t testing.TB, entries, flags uint32) *Ring {
	t.Helper()
	r, err := New(entries, 0, flags)
	if err != nil {
		t.Fatalf("New: %v (io_uring must work on the host for this package's tests)", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func TestNop(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags uint32
	}{
		{"sqe64", 0},
		{"sqe128", SetupSQE128},
		{"sqe128+cqe32", SetupSQE128 | SetupCQE32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRing(t, 8, tc.flags)
			if r.SQEntries() != 8 {
				t.Fatalf("SQEntries = %d, want 8", r.SQEntries())
			}
			// Two rounds of more than half the ring so the indices wrap.
			seen := map[uint64]bool{}
			for round := 0; round < 3; round++ {
				for i := 0; i < 6; i++ {
					sqe := r.GetSQE()
					if sqe == nil {
						t.Fatalf("round %d: GetSQE nil at %d", round, i)
					}
					PrepNop(sqe, uint64(round*100+i))
				}
				if n, err := r.SubmitAndWait(6); err != nil || n != 6 {
					t.Fatalf("SubmitAndWait = %d, %v", n, err)
				}
				for i := 0; i < 6; i++ {
					cqe := r.PeekCQE()
					if cqe == nil {
						t.Fatalf("round %d: only %d CQEs", round, i)
					}
					if cqe.Res != 0 {
						t.Fatalf("NOP res = %d", cqe.Res)
					}
					seen[cqe.UserData] = true
					r.SeenCQE()
				}
				if r.PeekCQE() != nil {
					t.Fatal("extra CQE")
				}
			}
			for round := 0; round < 3; round++ {
				for i := 0; i < 6; i++ {
					if !seen[uint64(round*100+i)] {
						t.Errorf("user_data %d never completed", round*100+i)
					}
				}
			}
		})
	}
}

func TestRingFull(t *testing.T) {
	r := newRing(t, 4, 0)
	for i := 0; i < 4; i++ {
		if r.GetSQE() == nil {
			t.Fatalf("GetSQE nil at %d", i)
		}
	}
	if r.GetSQE() != nil {
		t.Fatal("GetSQE on a full SQ returned an entry")
	}
	if r.Pending() != 4 {
		t.Fatalf("Pending = %d", r.Pending())
	}
	if n, err := r.Submit(); err != nil || n != 4 {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	if r.GetSQE() == nil {
		t.Fatal("GetSQE nil after the kernel consumed the SQ")
	}
}

// TestEventfdRead is the wake-up path the ublk queue uses: a READ on an eventfd completes when
// another goroutine writes the eventfd.
func TestEventfdRead(t *testing.T) {
	r := newRing(t, 4, SetupSQE128)
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	var buf [8]byte
	PrepRead(r.GetSQE(), efd, buf[:], -1, 42)
	if _, err := r.Submit(); err != nil {
		t.Fatal(err)
	}
	if r.PeekCQE() != nil {
		t.Fatal("eventfd read completed before any write")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 5)
		if _, err := unix.Write(efd, one[:]); err != nil {
			t.Error(err)
		}
	}()
	if _, err := r.SubmitAndWait(1); err != nil {
		t.Fatal(err)
	}
	<-done
	cqe := r.PeekCQE()
	if cqe == nil || cqe.UserData != 42 || cqe.Res != 8 {
		t.Fatalf("cqe = %+v, want user_data 42 res 8", cqe)
	}
	r.SeenCQE()
	if v := binary.NativeEndian.Uint64(buf[:]); v != 5 {
		t.Fatalf("eventfd value = %d, want 5", v)
	}
}

// pollPipe returns a pipe, closed at the end of the test, with a POLLIN on its read end prepared
// (not yet submitted) on r under user data ud.
func pollPipe(t *testing.T, r *Ring, ud uint64) [2]int {
	t.Helper()
	p := newPipe(t)
	PrepPollAdd(r.GetSQE(), p[0], unix.POLLIN, ud)
	return p
}

// newPipe is a pipe closed when the test ends: p[0] reads, p[1] writes.
func newPipe(t *testing.T) (p [2]int) {
	t.Helper()
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	return p
}

func TestPollAddPipe(t *testing.T) {
	r := newRing(t, 4, 0)
	p := pollPipe(t, r, 7)
	if _, err := r.Submit(); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(p[1], []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.SubmitAndWait(1); err != nil {
		t.Fatal(err)
	}
	cqe := r.PeekCQE()
	if cqe == nil || cqe.UserData != 7 || cqe.Res&unix.POLLIN == 0 {
		t.Fatalf("cqe = %+v, want POLLIN for user_data 7", cqe)
	}
	r.SeenCQE()

	// READ on the pipe returns the byte.
	buf := make([]byte, 4)
	PrepRead(r.GetSQE(), p[0], buf, -1, 8)
	if _, err := r.SubmitAndWait(1); err != nil {
		t.Fatal(err)
	}
	cqe = r.PeekCQE()
	if cqe == nil || cqe.Res != 1 || buf[0] != 'x' {
		t.Fatalf("read cqe = %+v buf %q", cqe, buf)
	}
	r.SeenCQE()
}

// TestUringCmdUnsupportedFile checks that a URING_CMD SQE is well-formed enough for the kernel to
// route it to the file: an eventfd has no uring_cmd handler, so the kernel answers EOPNOTSUPP
// (a malformed SQE would give EINVAL).
func TestUringCmdUnsupportedFile(t *testing.T) {
	r := newRing(t, 4, SetupSQE128)
	if r.Cmd(r.GetSQE()) == nil {
		t.Fatal("Cmd nil on an SQE128 ring")
	}
	r.localTail-- // give the probe SQE back
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	sqe := r.GetSQE()
	PrepUringCmd(sqe, efd, 0xc0107520, 9)
	cmd := r.Cmd(sqe)
	cmd[0] = 1
	if _, err := r.SubmitAndWait(1); err != nil {
		t.Fatal(err)
	}
	cqe := r.PeekCQE()
	if cqe == nil || cqe.UserData != 9 {
		t.Fatalf("cqe = %+v", cqe)
	}
	if errno := unix.Errno(-cqe.Res); !errors.Is(errno, unix.EOPNOTSUPP) {
		t.Fatalf("URING_CMD on an eventfd: res %d (%v), want -EOPNOTSUPP", cqe.Res, errno)
	}
	r.SeenCQE()
}

func TestCmdNilWithoutSQE128(t *testing.T) {
	r := newRing(t, 2, 0)
	if r.Cmd(r.GetSQE()) != nil {
		t.Fatal("Cmd on a 64-byte SQE ring must be nil")
	}
}

func TestSetupError(t *testing.T) {
	if _, err := New(0, 0, 0); err == nil {
		t.Fatal("io_uring_setup with 0 entries succeeded")
	}
}

// BenchmarkNop measures a submit+complete round trip; it must not allocate.
func BenchmarkNop(b *testing.B) {
	r := newRing(b, 8, SetupSQE128)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		PrepNop(r.GetSQE(), uint64(i))
		if _, err := r.SubmitAndWait(1); err != nil {
			b.Fatal(err)
		}
		if r.PeekCQE() == nil {
			b.Fatal("no CQE")
		}
		r.SeenCQE()
	}
}

// TestSubmitAndWaitSurvivesSignals: a signal delivered while SubmitAndWait waits must not make it
// return before the CQE exists. io_uring_enter reports the SQEs it submitted even when a signal
// ends its wait early, which once let ublk's STOP_DEV return "no completion". The waiter is
// signalled until the pipe it polls is written; whenever it returns, the CQE must be there.
func TestSubmitAndWaitSurvivesSignals(t *testing.T) {
	r := newRing(t, 4, 0)
	p := pollPipe(t, r, 9)
	tid := make(chan int, 1)
	type result struct {
		ready uint32
		err   error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid <- unix.Gettid()
		_, err := r.SubmitAndWait(1)
		done <- result{r.cqReady(), err}
	}()
	id := <-tid
	// SIGURG is what the runtime itself uses for preemption: harmless to a Go thread, but it
	// interrupts a blocking system call.
	for i := 0; i < 50; i++ {
		if err := unix.Tgkill(unix.Getpid(), id, unix.SIGURG); err != nil {
			t.Fatal(err)
		}
		select {
		case res := <-done:
			t.Fatalf("SubmitAndWait(1) returned before the pipe was written: %d CQEs ready, err %v", res.ready, res.err)
		case <-time.After(2 * time.Millisecond): // spacing of the signals, not synchronisation
		}
	}
	if _, err := unix.Write(p[1], []byte("x")); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil || res.ready < 1 {
		t.Fatalf("SubmitAndWait(1) = %v with %d CQEs ready, want nil and at least 1", res.err, res.ready)
	}
	if cqe := r.PeekCQE(); cqe == nil || cqe.UserData != 9 {
		t.Fatalf("cqe = %+v, want the POLLIN for user_data 9", cqe)
	}
	r.SeenCQE()
}

// TestWaitOnOneP: a locked thread waiting in SubmitAndWait at GOMAXPROCS=1 (the gateway's shape
// on small hosts) lets the goroutine whose write it waits for run, round after round, whether
// its waits hand the P off (enterBlocking: runtime.entersyscallblock, exitsyscall) or keep it
// (SetWaitKeepsP: sysmon takes it back), and each wait comes back with its CQE. Both modes pass
// it: TestWaitHandsOffP is what tells them apart.
func TestWaitOnOneP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keepP=%v", keep), func(t *testing.T) {
			r := newRing(t, 4, 0)
			r.SetWaitKeepsP(keep)
			p := newPipe(t)
			const rounds = 200
			waiting := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				buf := make([]byte, 1)
				for i := range rounds {
					PrepRead(r.GetSQE(), p[0], buf, -1, uint64(i))
					waiting <- struct{}{}
					if _, err := r.SubmitAndWait(1); err != nil {
						done <- err
						return
					}
					cqe := r.PeekCQE()
					if cqe == nil || cqe.UserData != uint64(i) || cqe.Res != 1 || buf[0] != byte(i) {
						done <- fmt.Errorf("round %d: cqe %+v, byte %d", i, cqe, buf[0])
						return
					}
					r.SeenCQE()
				}
				done <- nil
			}()
			for i := range rounds {
				<-waiting
				if _, err := unix.Write(p[1], []byte{byte(i)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestSubmitAndWaitWithCQEsReady: with a CQE already there, SubmitAndWait(1) submits what is
// pending without waiting (a short call, which keeps the P) and returns at once; the new SQE's
// own CQE follows.
func TestSubmitAndWaitWithCQEsReady(t *testing.T) {
	r := newRing(t, 4, 0)
	PrepNop(r.GetSQE(), 1)
	if _, err := r.SubmitAndWait(1); err != nil {
		t.Fatal(err)
	}
	p := newPipe(t)
	buf := make([]byte, 1)
	PrepRead(r.GetSQE(), p[0], buf, -1, 2) // cannot complete until the write below
	n, err := r.SubmitAndWait(1)
	if err != nil || n != 1 || r.Pending() != 0 {
		t.Fatalf("SubmitAndWait with a CQE ready: %d submitted, %v, %d pending; want 1, nil, 0", n, err, r.Pending())
	}
	if cqe := r.PeekCQE(); cqe == nil || cqe.UserData != 1 {
		t.Fatalf("first CQE %+v, want the NOP's", cqe)
	}
	r.SeenCQE()
	if _, err := unix.Write(p[1], []byte{7}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.SubmitAndWait(1); err != nil {
		t.Fatal(err)
	}
	if cqe := r.PeekCQE(); cqe == nil || cqe.UserData != 2 || cqe.Res != 1 || buf[0] != 7 {
		t.Fatalf("read CQE %+v (byte %d), want the read's", cqe, buf[0])
	}
	r.SeenCQE()
}
