//go:build vm && cgo && linux && !nordma

package rdma

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// vmAddr brings up soft-RoCE in the guest (test/vm/guest/rxe-up.sh) and returns its address.
// Outside the guest the test fails, as CONVENTIONS.md requires.
func vmAddr(t *testing.T) string {
	t.Helper()
	vmtest.Require(t)
	return vmtest.RXEUp(t).Addr
}

// completions collects completions on a channel (tests only: copies each one).
func completions(n int) (chan Completion, func([]Completion)) {
	ch := make(chan Completion, n)
	return ch, func(b []Completion) {
		for _, c := range b {
			ch <- c
		}
	}
}

func waitComp(t *testing.T, ch chan Completion, want CompletionOp) Completion {
	t.Helper()
	select {
	case c := <-ch:
		if !c.OK() {
			t.Fatalf("completion %d (op %d) failed: %s", c.ID, c.Op, statusString(c.Status))
		}
		if c.Op != want {
			t.Fatalf("completion %d: op %d, want %d", c.ID, c.Op, want)
		}
		return c
	case <-time.After(20 * time.Second):
		t.Fatalf("no completion (want op %d) within 20 s", want)
	}
	return Completion{}
}

// rdmaResCount counts rdma-core objects of kind (qp, cq, mr, pd) that belong to this process,
// as the kernel reports them ("rdma res show KIND"). The kernel records the creating thread's id,
// so every thread of the process counts.
func rdmaResCount(t *testing.T, kind string) int {
	t.Helper()
	out, err := exec.Command("rdma", "res", "show", kind).CombinedOutput()
	if err != nil {
		t.Fatalf("rdma res show %s: %v\n%s", kind, err, out)
	}
	tids, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range bytes.Split(out, []byte("\n")) {
		line = append(line, ' ')
		for _, tid := range tids {
			if bytes.Contains(line, []byte(" pid "+tid.Name()+" ")) {
				n++
				break
			}
		}
	}
	return n
}

func TestLoopbackSendRecvReadWrite(t *testing.T) {
	addr := vmAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	before := Stats()

	l, err := Listen(ctx, addr, 0)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer l.Close()

	const memSize = 1 << 20
	srvComp, srvOn := completions(64)
	type srvResult struct {
		c   *Conn
		mem []byte
		mr  *MR
		err error
	}
	srvCh := make(chan srvResult, 1)
	go func() {
		// the server issues RDMA Reads, so it needs an initiator depth
		c, err := l.Accept(ctx, Config{SendDepth: 16, RecvDepth: 16, InitiatorDepth: 4, OnCompletion: srvOn},
			func(p []byte) ([]byte, error) {
				// IB CM pads private data to a fixed size: compare the prefix
				if !bytes.HasPrefix(p, []byte("hello-iser")) {
					return nil, fmt.Errorf("unexpected private data %q", p)
				}
				return nil, nil
			})
		if err != nil {
			srvCh <- srvResult{err: err}
			return
		}
		mem, err := allocMem(memSize)
		if err != nil {
			c.Close()
			srvCh <- srvResult{err: err}
			return
		}
		mr, err := c.Register(mem, AccessLocalWrite)
		if err == nil {
			// one receive for the client's "here is my buffer" message
			err = c.PostRecv(RecvWR{ID: 1, SGE: mr.SGE(mem[:64])})
		}
		srvCh <- srvResult{c, mem, mr, err}
	}()

	cliComp, cliOn := completions(64)
	cli, err := Dial(ctx, addr, l.Port, Config{SendDepth: 16, RecvDepth: 16, OnCompletion: cliOn,
		PrivateData: []byte("hello-iser")})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	srv := <-srvCh
	if srv.err != nil {
		t.Fatalf("server: %v", srv.err)
	}
	cmem, err := allocMem(memSize)
	if err != nil {
		t.Fatal(err)
	}
	defer freeMem(cmem)
	defer freeMem(srv.mem)
	cmr, err := cli.Register(cmem, AccessLocalWrite|AccessRemoteRead|AccessRemoteWrite)
	if err != nil {
		t.Fatalf("register: %v", err)
	}
	// client buffer layout: [0,4K) message, [64K,128K) source for the server's RDMA Read,
	// [256K,320K) target of the server's RDMA Write.
	for i := range cmem[64<<10 : 128<<10] {
		cmem[64<<10+i] = byte(i*7 + 3)
	}
	if err := cli.PostRecv(RecvWR{ID: 10, SGE: cmr.SGE(cmem[512<<10 : 512<<10+64])}); err != nil {
		t.Fatal(err)
	}
	msg := cmem[:16]
	binary.BigEndian.PutUint64(msg[0:], cmr.Addr)
	binary.BigEndian.PutUint32(msg[8:], cmr.RKey)
	if err := cli.PostSend(SendWR{ID: 11, Op: OpSend, Signaled: true, NSGE: 1, SGE: [2]SGE{cmr.SGE(msg)}}); err != nil {
		t.Fatal(err)
	}
	waitComp(t, cliComp, CompSend)
	rc := waitComp(t, srvComp, CompRecv)
	if rc.ByteLen != 16 {
		t.Fatalf("server received %d bytes, want 16", rc.ByteLen)
	}
	raddr := binary.BigEndian.Uint64(srv.mem[0:])
	rkey := binary.BigEndian.Uint32(srv.mem[8:])
	if raddr != cmr.Addr || rkey != cmr.RKey {
		t.Fatalf("server got addr %#x rkey %#x, want %#x %#x", raddr, rkey, cmr.Addr, cmr.RKey)
	}

	// server: RDMA Read the client's [64K,128K) into its own [128K,192K), RDMA Write a pattern into
	// the client's [256K,320K), then SEND a note; chained in one post.
	for i := range srv.mem[192<<10 : 256<<10] {
		srv.mem[192<<10+i] = byte(i*13 + 1)
	}
	err = srv.c.PostSend(
		SendWR{ID: 21, Op: OpRDMARead, Signaled: true, RemoteAddr: raddr + 64<<10, RKey: rkey, NSGE: 1,
			SGE: [2]SGE{srv.mr.SGE(srv.mem[128<<10 : 192<<10])}},
		SendWR{ID: 22, Op: OpRDMAWrite, Signaled: true, RemoteAddr: raddr + 256<<10, RKey: rkey, NSGE: 1,
			SGE: [2]SGE{srv.mr.SGE(srv.mem[192<<10 : 256<<10])}},
		SendWR{ID: 23, Op: OpSend, Signaled: true, NSGE: 2,
			SGE: [2]SGE{srv.mr.SGE(srv.mem[300<<10 : 300<<10+4]), srv.mr.SGE(srv.mem[301<<10 : 301<<10+4])}},
	)
	if err != nil {
		t.Fatalf("server post: %v", err)
	}
	got := map[uint64]bool{}
	for range 3 {
		select {
		case c := <-srvComp:
			if !c.OK() {
				t.Fatalf("server completion %d: %s", c.ID, statusString(c.Status))
			}
			got[c.ID] = true
		case <-time.After(20 * time.Second):
			t.Fatal("server completions missing")
		}
	}
	if !got[21] || !got[22] || !got[23] {
		t.Fatalf("server completions %v", got)
	}
	rcv := waitComp(t, cliComp, CompRecv)
	if rcv.ID != 10 || rcv.ByteLen != 8 {
		t.Fatalf("client receive id %d len %d, want 10 and 8", rcv.ID, rcv.ByteLen)
	}
	if !bytes.Equal(srv.mem[128<<10:192<<10], cmem[64<<10:128<<10]) {
		t.Fatal("RDMA Read: server copy differs from client source")
	}
	if !bytes.Equal(cmem[256<<10:320<<10], srv.mem[192<<10:256<<10]) {
		t.Fatal("RDMA Write: client buffer differs from server source")
	}

	live := Stats()
	if live.LiveQPs-before.LiveQPs != 2 || live.LiveMRs-before.LiveMRs != 2 {
		t.Fatalf("live objects while connected: %+v (before %+v)", live, before)
	}
	if n := rdmaResCount(t, "qp"); n != 2 {
		t.Fatalf("rdma res show qp: %d QPs of ours, want 2", n)
	}

	if err := cli.Close(); err != nil {
		t.Fatalf("client close: %v", err)
	}
	if err := srv.c.Close(); err != nil {
		t.Fatalf("server close: %v", err)
	}
	l.Close()
	after := Stats()
	if after.LiveQPs != before.LiveQPs || after.LiveCQs != before.LiveCQs || after.LiveMRs != before.LiveMRs ||
		after.LivePDs != before.LivePDs || after.LiveConns != before.LiveConns {
		t.Fatalf("leak by our counters: before %+v after %+v", before, after)
	}
	for _, kind := range []string{"qp", "cq", "mr", "pd"} {
		if n := rdmaResCount(t, kind); n != 0 {
			out, _ := exec.Command("rdma", "res", "show", kind).CombinedOutput()
			t.Errorf("after close, rdma res show %s lists %d of ours:\n%s", kind, n, out)
		}
	}
}

func TestDialErrors(t *testing.T) {
	addr := vmAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	before := Stats()

	// nobody listens on this port: the peer's CM rejects the request
	_, err := Dial(ctx, addr, 1, Config{})
	if !errors.Is(err, ErrRefused) && !errors.Is(err, ErrUnreachable) {
		t.Fatalf("dial to a closed port: %v, want ErrRefused", err)
	}
	t.Logf("closed port: %v", err)
	// an address no RDMA device can reach (TEST-NET-1)
	_, err = Dial(ctx, "192.0.2.1", 3260, Config{ResolveTimeout: time.Second})
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("dial to an unroutable address: %v, want ErrUnreachable", err)
	}
	t.Logf("unreachable: %v", err)
	// refused by the listener's accept callback
	l, err := Listen(ctx, addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go l.Accept(ctx, Config{}, func([]byte) ([]byte, error) { return nil, errors.New("no thanks") })
	_, err = Dial(ctx, addr, l.Port, Config{})
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("dial rejected by the peer: %v, want ErrRefused", err)
	}
	// librdmacm holds a PD per device while any cm_id (the listener's too) is bound to it
	l.Close()
	after := Stats()
	if after.LiveQPs != before.LiveQPs || after.LiveCQs != before.LiveCQs || after.LivePDs != before.LivePDs {
		t.Fatalf("failed dials leaked: before %+v after %+v", before, after)
	}
	for _, kind := range []string{"qp", "cq", "pd"} {
		if n := rdmaResCount(t, kind); n != 0 {
			out, _ := exec.Command("rdma", "res", "show", kind).CombinedOutput()
			t.Errorf("after failed dials, rdma res show %s lists %d of ours:\n%s", kind, n, out)
		}
	}
}

// TestAckTimeoutReachesPeer checks what Config.AckTimeout does on a real rdma_cm connection: the
// dialer's queue pair gets that local ACK timeout, and so does the accepting side's, which never
// asked for it. rdma_cm announces it as the RoCE packet lifetime in the connect request, and the
// passive side (a kernel target such as LIO isert, or our Listener here) derives its own queue
// pair's timeout from that. Without it both sides use rdma_cm's default.
func TestAckTimeoutReachesPeer(t *testing.T) {
	addr := vmAddr(t)
	for _, tc := range []struct {
		name string
		exp  uint8
	}{{"default", 0}, {"set", 20}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			l, err := Listen(ctx, addr, 0)
			if err != nil {
				t.Fatalf("listen: %v", err)
			}
			defer l.Close()
			srvCh := make(chan *Conn, 1)
			errCh := make(chan error, 1)
			go func() {
				c, err := l.Accept(ctx, Config{SendDepth: 4, RecvDepth: 4}, func([]byte) ([]byte, error) { return nil, nil })
				if err != nil {
					errCh <- err
					return
				}
				srvCh <- c
			}()
			cli, err := Dial(ctx, addr, l.Port, Config{SendDepth: 4, RecvDepth: 4, AckTimeout: tc.exp})
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer cli.Close()
			var srv *Conn
			select {
			case srv = <-srvCh:
			case err := <-errCh:
				t.Fatalf("accept: %v", err)
			}
			defer srv.Close()
			ct, err := cli.AckTimeout()
			if err != nil {
				t.Fatal(err)
			}
			st, err := srv.AckTimeout()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("AckTimeout %d: dialer's QP timeout exponent %d (%v), acceptor's %d (%v)", tc.exp,
				ct, ackDuration(ct), st, ackDuration(st))
			if tc.exp != 0 && (ct != int(tc.exp) || st < int(tc.exp)) {
				t.Fatalf("asked for %d: dialer has %d, acceptor %d", tc.exp, ct, st)
			}
			if ct == 0 || st == 0 {
				t.Fatalf("a queue pair without an ACK timeout (dialer %d, acceptor %d) would wait forever for a lost ACK", ct, st)
			}
		})
	}
}

func ackDuration(exp int) time.Duration { return time.Duration(4096<<exp) * time.Nanosecond }

// TestLostCQEventRecovered reproduces a completion event that never reaches the poller (the
// kernel drops it when it cannot allocate the event entry; generating it has disarmed the CQ):
// the poller discards the event unseen. Without the safety re-poll the message below would sit in
// the CQ forever, since no later completion raises another event; with it, it is delivered within
// about cqSafetyPoll and counted in CQEventsMissed. A second message then shows the CQ was armed
// again (it arrives through a normal event).
func TestLostCQEventRecovered(t *testing.T) {
	addr := vmAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := Listen(ctx, addr, 0)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer l.Close()
	srvCh := make(chan *Conn, 1)
	errCh := make(chan error, 1)
	go func() {
		c, err := l.Accept(ctx, Config{SendDepth: 4, RecvDepth: 4}, func([]byte) ([]byte, error) { return nil, nil })
		if err != nil {
			errCh <- err
			return
		}
		srvCh <- c
	}()
	cliComp, cliOn := completions(8)
	cli, err := Dial(ctx, addr, l.Port, Config{SendDepth: 4, RecvDepth: 4, OnCompletion: cliOn})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer cli.Close()
	var srv *Conn
	select {
	case srv = <-srvCh:
	case err := <-errCh:
		t.Fatalf("accept: %v", err)
	}
	defer srv.Close()
	cmem, err := allocMem(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer freeMem(cmem)
	smem, err := allocMem(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer freeMem(smem)
	cmr, err := cli.Register(cmem, AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	smr, err := srv.Register(smem, AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := cli.PostRecv(RecvWR{ID: 1, SGE: cmr.SGE(cmem[:64])}, RecvWR{ID: 2, SGE: cmr.SGE(cmem[64:128])}); err != nil {
		t.Fatal(err)
	}
	before := Stats().CQEventsMissed
	cli.dropNextCQEvent.Store(true)
	start := time.Now()
	if err := srv.PostSend(SendWR{ID: 9, Op: OpSend, NSGE: 1, SGE: [2]SGE{smr.SGE(smem[:8])}}); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-cliComp:
		if c.ID != 1 || c.Op != CompRecv || !c.OK() {
			t.Fatalf("first completion: %+v", c)
		}
		t.Logf("the receive whose event was dropped was delivered after %v", time.Since(start).Round(time.Millisecond))
	case <-time.After(10 * cqSafetyPoll):
		t.Fatalf("a receive whose completion event was lost was not delivered within %v", 10*cqSafetyPoll)
	}
	if cli.dropNextCQEvent.Load() {
		t.Fatal("the poller never saw the event it was told to drop")
	}
	if got := Stats().CQEventsMissed - before; got != 1 {
		t.Fatalf("CQEventsMissed grew by %d, want 1", got)
	}
	if err := srv.PostSend(SendWR{ID: 10, Op: OpSend, NSGE: 1, SGE: [2]SGE{smr.SGE(smem[8:16])}}); err != nil {
		t.Fatal(err)
	}
	if c := waitComp(t, cliComp, CompRecv); c.ID != 2 {
		t.Fatalf("second receive: %+v", c)
	}
	if got := Stats().CQEventsMissed - before; got != 1 {
		t.Fatalf("CQEventsMissed grew by %d after a normal completion, want 1", got)
	}
}
