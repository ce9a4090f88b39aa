package ublk

import (
	"encoding/binary"
	"testing"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/frontend/ublk/uring"
)

// newHostQueue builds a queue whose ring is a real io_uring on the host and whose "character
// device" is an eventfd (URING_CMDs to it fail with EOPNOTSUPP, which is fine for exercising the
// hand-off and SQE preparation without ublk).
func newHostQueue(t testing.TB, depth int) *queue {
	t.Helper()
	fake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{log: zap.NewNop(), charFd: fake}
	bufs := make([][]byte, depth)
	for i := range bufs {
		bufs[i] = make([]byte, 4096)
	}
	q, err := newQueue(s, 3, depth, bufs)
	if err != nil {
		t.Fatal(err)
	}
	q.ring, err = uring.New(uint32(depth+1), uint32(2*(depth+1)), uring.SetupSQE128)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		q.ring.Close()
		unix.Close(q.efd)
		unix.Close(fake)
	})
	return q
}

func readEventfd(t testing.TB, fd int) uint64 {
	var b [8]byte
	n, err := unix.Read(fd, b[:])
	if err == unix.EAGAIN {
		return 0
	}
	if err != nil || n != 8 {
		t.Fatalf("eventfd read: %d, %v", n, err)
	}
	return binary.NativeEndian.Uint64(b[:])
}

// TestCompletionHandoff: completions from workers are batched behind one eventfd write, and the
// ring thread turns each into a COMMIT_AND_FETCH carrying the tag, queue, result and buffer.
func TestCompletionHandoff(t *testing.T) {
	q := newHostQueue(t, 4)
	q.inflight = 3
	q.complete(2, 4096)
	q.complete(0, -5)
	q.complete(3, 0)
	if v := readEventfd(t, q.efd); v != 1 {
		t.Fatalf("eventfd counter after 3 completions = %d, want 1 (one wake-up per batch)", v)
	}
	if err := q.takeCompletions(8); err != nil {
		t.Fatal(err)
	}
	if q.inflight != 0 || len(q.done) != 0 || q.wakePending {
		t.Fatalf("after take: inflight %d, done %d, wakePending %v", q.inflight, len(q.done), q.wakePending)
	}
	// 3 commits + the re-armed eventfd read are queued, unsubmitted.
	if p := q.ring.Pending(); p != 4 {
		t.Fatalf("pending SQEs = %d, want 4", p)
	}
	// A completion after the swap wakes again.
	q.inflight = 1
	q.complete(1, 512)
	if v := readEventfd(t, q.efd); v != 1 {
		t.Fatalf("second batch did not wake the ring (counter %d)", v)
	}
}

func TestPrepIOCmdLayout(t *testing.T) {
	q := newHostQueue(t, 2)
	tg := &q.tags[1]
	s, err := q.prepIOCmdSQE(ioCommitAndFetch, tg, -int32(unix.EIO))
	if err != nil {
		t.Fatal(err)
	}
	if s.Opcode != uring.OpUringCmd || s.Fd != int32(q.srv.charFd) || s.UserData != 1 {
		t.Fatalf("sqe = %+v", s)
	}
	if op := uint32(s.Off); op != ioCommitAndFetch || s.Off>>32 != 0 {
		t.Fatalf("cmd_op/pad = %#x", s.Off)
	}
	cmd := (*ioCmd)(unsafe.Pointer(q.ring.Cmd(s)))
	want := ioCmd{QID: 3, Tag: 1, Result: -int32(unix.EIO), Addr: uint64(uintptr(unsafe.Pointer(&tg.buf[0])))}
	if *cmd != want {
		t.Fatalf("ublksrv_io_cmd = %+v, want %+v", *cmd, want)
	}
	// The rest of the 80-byte command area is zero.
	for i, b := range q.ring.Cmd(s)[sizeofIOCmd:] {
		if b != 0 {
			t.Fatalf("command byte %d = %#x", sizeofIOCmd+i, b)
		}
	}
}

// BenchmarkCompletionHandoff is the per-request ring-side cost: a worker's complete(), the ring
// thread's batch swap, the COMMIT_AND_FETCH SQE and the eventfd re-arm. It must not allocate.
func BenchmarkCompletionHandoff(b *testing.B) {
	q := newHostQueue(b, 1)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		q.inflight = 1
		q.complete(0, 4096)
		if err := q.takeCompletions(8); err != nil {
			b.Fatal(err)
		}
		if _, err := q.ring.SubmitAndWait(2); err != nil {
			b.Fatal(err)
		}
		for q.ring.PeekCQE() != nil {
			q.ring.SeenCQE()
		}
	}
}

// The ring thread's wait keeps its P only while more than keepPMinInflight requests averaging
// under keepPMaxAvgBytes of data are in flight (4 KiB at QD32); an idle queue, a few requests
// (QD1) and large ones (1 MiB streams) hand it off. A DISCARD's or WRITE_ZEROES' range is no
// data. Committed requests leave the count.
func TestWaitKeepsP(t *testing.T) {
	q := newHostQueue(t, 64)
	fetch := func(n int, op uint32, sectors uint32) {
		for range n {
			tg := &q.tags[q.inflight]
			tg.opFlags, tg.nrSectors = op, sectors
			q.began(tg)
		}
	}
	commitAll := func() {
		for q.inflight > 0 {
			q.ended(&q.tags[q.inflight-1])
		}
		if q.inflightBytes != 0 {
			t.Fatalf("%d bytes still counted with nothing in flight", q.inflightBytes)
		}
	}
	for _, tc := range []struct {
		name    string
		n       int
		op      uint32
		sectors uint32
		keep    bool
	}{
		{"idle", 0, opRead, 0, false},
		{"QD1 4 KiB", 1, opRead, 8, false},
		{"4 × 4 KiB", keepPMinInflight, opRead, 8, false},
		{"5 × 4 KiB", keepPMinInflight + 1, opRead, 8, true},
		{"32 × 4 KiB", 32, opRead, 8, true},
		{"32 × 4 KiB writes", 32, opWrite, 8, true},
		{"16 × 512 KiB", 16, opRead, 1024, false},
		{"16 × 512 KiB writes", 16, opWrite, 1024, false},
		{"32 × 64 KiB", 32, opRead, keepPMaxAvgBytes >> 9, false},
		{"32 × 32 KiB", 32, opRead, 64, true},
		{"32 × 1 GiB DISCARD", 32, opDiscard, 1 << 21, true},
		{"32 × 1 GiB WRITE_ZEROES", 32, opWriteZeroes, 1 << 21, true},
		{"32 × 1 MiB FLUSH", 32, opFlush, 2048, true},
	} {
		fetch(tc.n, tc.op, tc.sectors)
		if got := q.waitKeepsP(); got != tc.keep {
			t.Errorf("%s in flight: waitKeepsP %v, want %v", tc.name, got, tc.keep)
		}
		commitAll()
	}
}
