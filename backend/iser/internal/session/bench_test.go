package session

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/fdtest"
)

// benchTarget answers READ(16) with one Data-In carrying status, over a real loopback socket,
// without allocating, so the benchmark's allocation count is the initiator's alone.
func benchTarget(b *testing.B, nc net.Conn, blk int) {
	f := &fakeTarget{t: b, nc: nc, statSN: 1, expCmdSN: 1, maxCmdSN: 1000, window: 1000}
	if err := f.login(); err != nil {
		b.Errorf("login: %v", err)
		return
	}
	var in, out pdu.BHS
	data := make([]byte, blk)
	iov := make([]byte, pdu.BHSLen+blk)
	for {
		if _, err := io.ReadFull(nc, in[:]); err != nil {
			return
		}
		if n := pdu.Padded(in.DataSegmentLength()); n > 0 {
			if _, err := io.CopyN(io.Discard, nc, int64(n)); err != nil {
				return
			}
		}
		switch in.Opcode() {
		case pdu.OpSCSICommand:
			f.expCmdSN = in.CmdSN() + 1
			f.maxCmdSN = f.expCmdSN + 999
			n := int(binary.BigEndian.Uint32(in.CDB()[10:14])) * 512
			pdu.EncodeDataIn(&out, pdu.FlagFinal|pdu.FlagStatus, 0, n, in.ITT(), pdu.ReservedTag, f.sns(), 0, 0, 0)
			f.statSN++
			copy(iov, out[:])
			copy(iov[pdu.BHSLen:], data[:n])
			if _, err := nc.Write(iov[:pdu.BHSLen+pdu.Padded(n)]); err != nil {
				return
			}
		case pdu.OpLogoutReq:
			pdu.EncodeLogoutResponse(&out, 0, in.ITT(), f.sns(), 0, 0)
			nc.Write(out[:])
			return
		}
	}
}

// benchSession logs a session in to a benchTarget serving 4 KiB reads on loopback; both end
// with the benchmark.
func benchSession(b *testing.B) *Session { return benchSessionSize(b, 4096) }

// benchSessionSize is benchSession for reads of up to blk bytes.
func benchSessionSize(b *testing.B, blk int) *Session {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		benchTarget(b, c, blk)
	}()
	s, err := New(Config{Portal: l.Addr().String(), InitiatorName: "iqn.2026-11.io.iser-blk:bench",
		TargetName: "iqn.2026-11.io.iser-blk:fake", MaxTasks: 64})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Login(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// BenchmarkExecuteRead4K measures the initiator's per-command cost with 32 commands in flight:
// Execute must not allocate (0 allocs/op).
func BenchmarkExecuteRead4K(b *testing.B) {
	s := benchSession(b)
	b.SetParallelism(16) // 32 goroutines on 2 CPUs
	b.ReportAllocs()
	b.SetBytes(4096)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var cmd scsi.Command
		var resp scsi.Response
		buf := make([]byte, 4096)
		rw16(&cmd, false, 0, buf)
		ctx := context.Background()
		for pb.Next() {
			if err := s.Execute(ctx, &cmd, &resp); err != nil || resp.Status != scsi.StatusGood {
				b.Errorf("execute: %v %v", err, resp.Status)
				return
			}
		}
	})
}

// benchSlot is one command slot of BenchmarkSubmitRead4K: its completion reports the slot index.
type benchSlot struct {
	i    int
	cmd  scsi.Command
	resp scsi.Response
	done chan<- int
	err  error
}

func (s *benchSlot) Complete(err error) {
	s.err = err
	s.done <- s.i
}

// BenchmarkSubmitRead4K is BenchmarkExecuteRead4K through Submit: one goroutine keeps 32 commands
// in flight, completions come from the reader, and it must not allocate either (0 allocs/op).
func BenchmarkSubmitRead4K(b *testing.B) {
	s := benchSession(b)
	const depth = 32
	done := make(chan int, depth)
	slots := make([]*benchSlot, depth)
	for i := range slots {
		slots[i] = &benchSlot{i: i, done: done}
		rw16(&slots[i].cmd, false, int64(i)*4096, make([]byte, 4096))
	}
	b.ReportAllocs()
	b.SetBytes(4096)
	b.ResetTimer()
	runSlots(b, s, slots, done, func(sl *benchSlot) {
		// depth is below MaxTasks and the target's window: Submit never has to decline.
		if !s.Submit(&sl.cmd, &sl.resp, sl) {
			b.Fatal("Submit declined")
		}
	}, nil)
}

// runSlots keeps every slot's command in flight until b.N have completed: start submits a slot's
// command (failing the benchmark if the session declines), and drain, if not nil, consumes the
// data of a slot whose command completed cleanly before the slot is started again.
func runSlots(b *testing.B, s *Session, slots []*benchSlot, done <-chan int, start, drain func(*benchSlot)) {
	inflight, started := 0, 0
	submit := func(sl *benchSlot) {
		start(sl)
		started++
		inflight++
	}
	for _, sl := range slots {
		if started == b.N {
			break
		}
		submit(sl)
	}
	s.Kick()
	for inflight > 0 {
		i := <-done
		inflight--
		sl := slots[i]
		if sl.err != nil || sl.resp.Status != scsi.StatusGood {
			b.Fatalf("command: %v %v", sl.err, sl.resp.Status)
		}
		if drain != nil {
			drain(sl)
		}
		if started < b.N {
			submit(sl)
		}
		if len(done) == 0 {
			s.Kick() // nothing more to collect right now: send what was resubmitted
		}
	}
}

// BenchmarkSubmitToPipe256K is BenchmarkSubmitRead4K for 256 KiB reads through SubmitToPipe: 8
// in flight, each spliced from the socket into its own pipe, which the benchmark empties into
// /dev/null with splice. The spliced read must not allocate (0 allocs/op).
func BenchmarkSubmitToPipe256K(b *testing.B) {
	const blk, depth = 256 << 10, 8
	s := benchSessionSize(b, blk)
	devNull, err := unix.Open("/dev/null", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Close(devNull) })
	done := make(chan int, depth)
	slots := make([]*benchSlot, depth)
	pipes := make([][2]int, depth)
	for i := range slots {
		slots[i] = &benchSlot{i: i, done: done}
		read16n(&slots[i].cmd, int64(i)*blk, blk)
		pipes[i][0], pipes[i][1] = fdtest.Pipe(b, 1<<20)
	}
	b.ReportAllocs()
	b.SetBytes(blk)
	b.ResetTimer()
	runSlots(b, s, slots, done, func(sl *benchSlot) {
		if !s.SubmitToPipe(&sl.cmd, blk, pipes[sl.i][1], &sl.resp, sl) {
			b.Fatal("SubmitToPipe declined")
		}
	}, func(sl *benchSlot) {
		for left := blk; left > 0; {
			k, err := unix.Splice(pipes[sl.i][0], nil, devNull, nil, left, unix.SPLICE_F_MOVE)
			if err != nil || k == 0 {
				b.Fatalf("emptying the pipe: %d %v", k, err)
			}
			left -= int(k)
		}
	})
}

// batchedSlot is a benchSlot completed in runs (BatchCompleter), all slots sharing one Flusher as
// the NBD requests of one connection do.
type batchedSlot struct {
	*benchSlot
	f *countFlusher
}

type countFlusher struct{ n atomic.Int64 }

func (f *countFlusher) Flush() { f.n.Add(1) }

func (s *batchedSlot) CompleteBatched(err error) block.Flusher {
	s.Complete(err)
	return s.f
}

// BenchmarkSubmitRead4KBatched is BenchmarkSubmitRead4K with completions in runs (batch.go): the
// reader's run bookkeeping must not allocate either (0 allocs/op).
func BenchmarkSubmitRead4KBatched(b *testing.B) {
	s := benchSession(b)
	const depth = 32
	done := make(chan int, depth)
	slots := make([]*benchSlot, depth)
	batched := make([]*batchedSlot, depth)
	f := &countFlusher{}
	for i := range slots {
		slots[i] = &benchSlot{i: i, done: done}
		batched[i] = &batchedSlot{slots[i], f}
		rw16(&slots[i].cmd, false, int64(i)*4096, make([]byte, 4096))
	}
	b.ReportAllocs()
	b.SetBytes(4096)
	b.ResetTimer()
	runSlots(b, s, slots, done, func(sl *benchSlot) {
		if !s.Submit(&sl.cmd, &sl.resp, batched[sl.i]) {
			b.Fatal("Submit declined")
		}
	}, nil)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/float64(max(f.n.Load(), 1)), "completions/flush")
}
