package control

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// release lets a held detach go on; a second call does nothing.
func release(g *fakeGateway) {
	select {
	case <-g.hold:
	default:
		close(g.hold)
	}
}

// heldDetach serves a fake gateway whose detach holds until released, starts one on a raw
// connection and returns once the handler runs.
func heldDetach(t *testing.T) (s *Server, g *fakeGateway, c *rawConn, dir string) {
	t.Helper()
	dir = testRunDir(t)
	g = newFakeGateway("gw")
	g.entered, g.hold = make(chan struct{}), make(chan struct{})
	s = serveInProcess(t, dir, "gw", g, Options{})
	t.Cleanup(func() { release(g) }) // before the server's cleanup: a held handler blocks Close
	c = dialRaw(t, dir, "gw")
	if _, err := c.conn.Write([]byte(`{"version":1,"op":"detach"}` + "\n")); err != nil {
		t.Fatal(err)
	}
	<-g.entered
	return s, g, c, dir
}

// closeStarted runs s.Close in the background and returns once it stopped accepting (the step
// just before it waits for a running detach), with the channel its result arrives on.
func closeStarted(t *testing.T, s *Server, dir string) <-chan error {
	t.Helper()
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		conn, err := net.Dial("unix", SocketPath(dir, "gw"))
		if errors.Is(err, syscall.ECONNREFUSED) {
			return closed
		}
		if err == nil {
			conn.Close()
		}
		<-tick.C
	}
}

// TestCloseLetsADetachAnswer: Close waits for a running detach's final reply, so its client
// reads "done" rather than a closed connection; a new detach meanwhile is refused as busy.
func TestCloseLetsADetachAnswer(t *testing.T) {
	s, g, c, dir := heldDetach(t)
	other := dialRaw(t, dir, "gw")
	if r := other.send(`{"version":1,"op":"status"}`); r.Type != ReplyStatus { // served, not just queued
		t.Fatalf("status: %+v", r)
	}
	closed := closeStarted(t, s, dir)
	wantError(t, other.send(`{"version":1,"op":"detach"}`), CodeBusy)
	release(g)
	for {
		r := c.read()
		if r.Type == ReplyProgress {
			continue
		}
		if r.Type != ReplyDone || r.Result == nil || r.Result.WrittenBackBytes != 3 {
			t.Fatalf("final reply %+v, want done with 3 bytes written back", r)
		}
		break
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// TestCloseDoesNotWaitForAHungUpClient: a detach whose client hung up has nobody to answer:
// Close returns as soon as the handler does, not after answerWait.
func TestCloseDoesNotWaitForAHungUpClient(t *testing.T) {
	s, g, c, dir := heldDetach(t)
	c.conn.Close()
	closed := closeStarted(t, s, dir)
	released := time.Now()
	release(g)
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if took := time.Since(released); took > answerWait/2 {
		t.Fatalf("Close took %v after the detach of a hung-up client ended", took)
	}
}
