package nbd

import (
	"bytes"
	"context"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/pool"
)

// intakeConn serves a memory device on one end of a socket pair in the transmission phase, as a
// kernel device's connection, and returns the server's conn for it and the client's end.
func intakeConn(t *testing.T) (*conn, *Server, net.Conn) {
	t.Helper()
	return intakeConnOn(t, newMem(t, 16<<20, ""))
}

// intakeConnOn is intakeConn serving dev.
func intakeConnOn(t *testing.T, dev block.Device) (*conn, *Server, net.Conn) {
	t.Helper()
	p, err := pool.New(pool.Config{MaxBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	srv, err := NewServer(dev, Options{Pool: p})
	if err != nil {
		t.Fatal(err)
	}
	local, client := connectedPair(t)
	started := make(chan *conn, 1)
	done := make(chan struct{})
	go func() {
		srv.serveTransmission(local, func(c *conn) { started <- c })
		close(done)
	}()
	t.Cleanup(func() {
		client.Close()
		srv.Close()
		<-done
	})
	return <-started, srv, client
}

// intakeRequest is request i of the stream the pause tests send: WRITEs of 4 KiB and of 68 KiB
// (more than the reader's 64 KiB buffer, so payloads straddle its refills), READs, FLUSHes;
// handles 1, 2, 3, ... in order, a WRITE's payload filled with its handle's low byte.
func intakeRequest(i int) (h header, payload []byte) {
	h = header{Handle: uint64(i + 1), Offset: uint64(i%64) * 128 << 10}
	switch i % 5 {
	case 0, 3:
		h.Type, h.Length = cmdWrite, 4<<10
	case 1:
		h.Type, h.Length = cmdWrite, 68<<10
	case 2:
		h.Type, h.Length = cmdRead, 8<<10
	case 4:
		h.Type, h.Offset = cmdFlush, 0
	}
	if h.Type == cmdWrite {
		payload = make([]byte, h.Length)
		for j := range payload {
			payload[j] = byte(h.Handle)
		}
	}
	return h, payload
}

func intakeLength(handle uint64) int {
	if h, _ := intakeRequest(int(handle) - 1); h.Type == cmdRead {
		return int(h.Length)
	}
	return 0
}

// TestPauseIntakeStopsAtARequestBoundary: requests stream in; the pause stops the reader with
// every request it read answered and nothing of the next one read. What is left in the socket
// is the rest of the stream, whole: the next header is the next handle, each payload its own.
func TestPauseIntakeStopsAtARequestBoundary(t *testing.T) {
	const total = 3000
	c, srv, client := intakeConn(t)
	sent := make(chan error, 1)
	go func() {
		for i := range total {
			h, payload := intakeRequest(i)
			b := make([]byte, requestHeaderLen+len(payload))
			putRequest(b, h)
			copy(b[requestHeaderLen:], payload)
			if _, err := client.Write(b); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	var replied atomic.Int64
	var mu sync.Mutex
	handles := map[uint64]bool{}
	some := make(chan struct{})
	repliesEnded := make(chan struct{})
	go func() {
		defer close(repliesEnded)
		tc := newTestClient(t, client)
		for {
			r, err := tc.readReply(intakeLength)
			if err != nil {
				return
			}
			mu.Lock()
			handles[r.handle] = true
			mu.Unlock()
			if replied.Add(1) == 200 {
				close(some)
			}
			if r.errno != 0 {
				t.Errorf("request %d: errno %d", r.handle, r.errno)
			}
		}
	}()
	select {
	case <-some:
	case <-time.After(30 * time.Second):
		t.Fatal("no 200 replies within 30 s")
	}
	pauseWithin(t, c, 30*time.Second)

	// Every request the server read is answered: the replies are on their way. The rest of the
	// stream is in the socket: read it where the server would have.
	_ = c.nc.SetReadDeadline(time.Now().Add(30 * time.Second)) // a hang here is a failure
	if c.br.Buffered() != 0 {
		t.Fatalf("%d bytes buffered at the pause", c.br.Buffered())
	}
	next, first := uint64(0), uint64(0)
	var raw [requestHeaderLen]byte
	for left := 0; ; left++ {
		if _, err := io.ReadFull(c.nc, raw[:]); err != nil {
			t.Fatalf("reading what the pause left, after %d requests: %v", left, err)
		}
		h, err := parseRequest(&raw)
		if err != nil {
			t.Fatalf("what the pause left does not start at a request (%d requests in): %v", left, err)
		}
		if next == 0 {
			next, first = h.Handle, h.Handle
			t.Logf("paused after %d requests; the socket holds %d..%d", first-1, first, total)
		}
		want, payload := intakeRequest(int(next) - 1)
		if h != want {
			t.Fatalf("request %d left in the socket is %+v, want %+v", next, h, want)
		}
		got := make([]byte, len(payload))
		if _, err := io.ReadFull(c.nc, got); err != nil {
			t.Fatal(err)
		}
		if string(got) != string(payload) {
			t.Fatalf("request %d's payload differs", next)
		}
		if next == total {
			break
		}
		next++
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	// The server ends (its reader, resumed by Close, meets the closed socket); the client then
	// reads every reply there is, up to EOF.
	srv.Close()
	select {
	case <-repliesEnded:
	case <-time.After(30 * time.Second):
		t.Fatal("the replies did not end within 30 s of the server's close")
	}
	read := first - 1
	if len(handles) != int(read) || int64(read) != replied.Load() {
		t.Fatalf("%d replies for %d distinct handles; the server read %d requests", replied.Load(), len(handles), read)
	}
	for h := uint64(1); h <= read; h++ {
		if !handles[h] {
			t.Fatalf("request %d was read but not answered", h)
		}
	}
}

// TestPauseIntakeWakesAnIdleReader: a reader waiting for a header is woken by the pause; resumed,
// it serves the next request (the pause's deadline is gone).
func TestPauseIntakeWakesAnIdleReader(t *testing.T) {
	c, _, client := intakeConn(t)
	tc := newTestClient(t, client)
	tc.do(cmdWrite, 0, 0, 4096, make([]byte, 4096)) // the reader is past its first read
	// paused and resumed twice: the pause can be retried (a restart that failed, then another)
	for _, cmd := range []uint16{cmdRead, cmdFlush} {
		pauseWithin(t, c, 10*time.Second)
		c.resumeIntake()
		length := uint32(4096)
		if cmd == cmdFlush {
			length = 0
		}
		if r := tc.do(cmd, 0, 0, length, nil); r.errno != 0 {
			t.Fatalf("command %d after the resume: errno %d", cmd, r.errno)
		}
	}
}

// pauseWithin pauses c's reader and waits for it to stop.
func pauseWithin(t *testing.T, c *conn, d time.Duration) {
	t.Helper()
	select {
	case <-c.pauseIntake():
	case <-time.After(d):
		t.Fatalf("the reader did not stop within %v", d)
	}
}

// TestShutdownEndsAPausedReader: a shutdown during a pause (a stop signal during a restart)
// ends the connection instead of leaving its reader parked.
func TestShutdownEndsAPausedReader(t *testing.T) {
	c, srv, client := intakeConn(t)
	tc := newTestClient(t, client)
	tc.do(cmdWrite, 0, 0, 4096, make([]byte, 4096))
	pauseWithin(t, c, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown of a paused connection: %v", err)
	}
}

// heldWrites is a device whose WRITEs wait until release is closed.
type heldWrites struct {
	block.Device
	started chan struct{} // one value per write that began
	release chan struct{}
}

func (d *heldWrites) WriteAt(ctx context.Context, p []byte, off int64, f block.WriteFlags) error {
	d.started <- struct{}{}
	<-d.release
	return d.Device.WriteAt(ctx, p, off, f)
}

// notParkedFor requires the reader to stay running for d: a bounded negative check.
func notParkedFor(t *testing.T, parked <-chan struct{}, d time.Duration, why string) {
	t.Helper()
	select {
	case <-parked:
		t.Fatalf("the reader reported parked %s", why)
	case <-time.After(d):
	}
}

// TestPauseWaitsForTheRequestsRead: the reader reports parked only once every request it read is
// answered; a WRITE still on the device holds the pause.
func TestPauseWaitsForTheRequestsRead(t *testing.T) {
	dev := &heldWrites{Device: newMem(t, 16<<20, ""), started: make(chan struct{}, 1), release: make(chan struct{})}
	c, _, client := intakeConnOn(t, dev)
	tc := newTestClient(t, client)
	if err := tc.send(cmdWrite, 0, 1, 0, 4096, make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	<-dev.started
	parked := c.pauseIntake()
	notParkedFor(t, parked, 300*time.Millisecond, "with a WRITE still on the device")
	close(dev.release)
	parkedAfterReply(t, parked, tc, 1)
}

// TestPauseMidRequestFinishesIt: a pause that comes while half a WRITE's payload has arrived
// lets the reader read the rest and serve it; the stop comes after it.
func TestPauseMidRequestFinishesIt(t *testing.T) {
	c, _, client := intakeConn(t)
	tc := newTestClient(t, client)
	tc.do(cmdFlush, 0, 0, 0, nil)
	waitWaiting(t, c, true) // the reader waits for the next header
	b := make([]byte, requestHeaderLen+8192)
	putRequest(b, header{Type: cmdWrite, Handle: 9, Length: 8192})
	if _, err := client.Write(b[:requestHeaderLen+4096]); err != nil {
		t.Fatal(err)
	}
	waitWaiting(t, c, false) // it has the header, and waits for the payload's second half
	// The pause sets no deadline (the reader is not waiting for a header); one that a pause's
	// race could leave is set by hand.
	parked := c.pauseIntake()
	_ = c.nc.SetReadDeadline(time.Now())
	notParkedFor(t, parked, 300*time.Millisecond, "in the middle of a WRITE")
	if _, err := client.Write(b[requestHeaderLen+4096:]); err != nil {
		t.Fatal(err)
	}
	parkedAfterReply(t, parked, tc, 9)
}

// TestStaleDeadlineAfterResume: a pause's deadline that a reader sees only after the resume is
// cleared, not taken for the end of the connection.
func TestStaleDeadlineAfterResume(t *testing.T) {
	c, _, client := intakeConn(t)
	tc := newTestClient(t, client)
	tc.do(cmdWrite, 0, 0, 4096, make([]byte, 4096))
	pauseWithin(t, c, 10*time.Second)
	c.resumeIntake()
	_ = c.nc.SetReadDeadline(time.Now()) // as if the pause's deadline landed after the resume
	if r := tc.do(cmdRead, 0, 0, 4096, nil); r.errno != 0 {
		t.Fatalf("read after a stale deadline: errno %d", r.errno)
	}
}

// waitWaiting waits until the reader is (or is no longer) waiting for a header with nothing
// buffered: intake.waiting changes only on the reader's own steps.
func waitWaiting(t *testing.T, c *conn, want bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); c.intake.waiting.Load() != want; runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("the reader's header wait is not %v within 10 s", want)
		}
	}
}

// parkedAfterReply requires the reader to stop within 10 s, with the WRITE handle answered.
func parkedAfterReply(t *testing.T, parked <-chan struct{}, tc *testClient, handle uint64) {
	t.Helper()
	select {
	case <-parked:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader did not stop within 10 s of the WRITE's end")
	}
	if r, err := tc.readReply(nil); err != nil || r.handle != handle || r.errno != 0 {
		t.Fatalf("the WRITE's reply: %+v, %v; want handle %d answered", r, err, handle)
	}
}

// TestExactReaderNeverReadsAhead: exactReader serves what the buffered reader holds first, never
// more than asked, and then asks the socket for no more than asked either, so that what the
// caller did not ask for stays in the socket for whoever reads it next.
func TestExactReaderNeverReadsAhead(t *testing.T) {
	local, client := connectedPair(t)
	defer client.Close()
	c := newConn(&Server{log: zap.NewNop()}, local)
	defer local.Close()
	stream := make([]byte, 64)
	for i := range stream {
		stream[i] = byte(i)
	}
	if _, err := client.Write(stream[:16]); err != nil {
		t.Fatal(err)
	}
	// buffer the first 16 bytes the way the reader does outside a pause
	if _, err := c.br.Peek(16); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Write(stream[16:]); err != nil {
		t.Fatal(err)
	}
	e := exactReader{c}
	read := func(n, want, from int) {
		t.Helper()
		p := make([]byte, n)
		got, err := e.Read(p)
		if err != nil || got != want || !bytes.Equal(p[:got], stream[from:from+want]) {
			t.Fatalf("Read(%d) = %d, %v (% x); want %d bytes from offset %d", n, got, err, p[:got], want, from)
		}
	}
	read(10, 10, 0) // from the buffer, no more than asked
	read(20, 6, 10) // the buffer's rest only: the socket is not touched while bytes are buffered
	read(8, 8, 16)  // the socket, no more than asked
	if n := c.br.Buffered(); n != 0 {
		t.Fatalf("%d bytes buffered after reading the socket directly", n)
	}
	// the other 40 bytes are still in the socket, in order
	_ = local.SetReadDeadline(time.Now().Add(10 * time.Second)) // a hang here is a failure
	rest, err := io.ReadAll(io.LimitReader(local, 40))
	if err != nil || !bytes.Equal(rest, stream[24:]) {
		t.Fatalf("socket holds % x, %v; want the stream's last 40 bytes", rest, err)
	}
}
