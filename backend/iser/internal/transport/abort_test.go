package transport

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/internal/fdtest"
)

// TestTCPAbortDiscardsQueued: a connection given up on while bytes wait in its send queue (the
// target stopped reading) is reset by Abort, and the target never gets the rest; a plain Close
// delivers the queue and then the end of the stream, which is what Abort exists to prevent.
func TestTCPAbortDiscardsQueued(t *testing.T) {
	const total = 16 << 20
	for _, abort := range []bool{true, false} {
		a, b := fdtest.TCPPair(t)
		a.(*net.TCPConn).SetWriteBuffer(64 << 10) //nolint:errcheck // smaller queues fill sooner; not required
		b.(*net.TCPConn).SetReadBuffer(64 << 10)  //nolint:errcheck
		c := NewTCPConn(a)
		written := make(chan error, 1)
		go func() { written <- c.writev([][]byte{make([]byte, total)}) }()
		waitQueued(t, a.(*net.TCPConn))
		if abort {
			c.Abort()
		} else {
			c.Close()
		}
		select {
		case err := <-written:
			if err == nil {
				t.Fatalf("abort=%v: the %d-byte write completed although the peer read nothing", abort, total)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("abort=%v: the blocked write did not return after the close", abort)
		}
		n, err := io.Copy(io.Discard, b)
		switch {
		case abort && !errors.Is(err, syscall.ECONNRESET):
			t.Fatalf("Abort: the peer read %d bytes and then %v, want a reset", n, err)
		case !abort && err != nil:
			t.Fatalf("Close: the peer read %d bytes and then %v, want the end of the stream", n, err)
		case n >= total:
			t.Fatalf("abort=%v: the peer read all %d bytes", abort, n)
		}
		t.Logf("abort=%v: the peer read %d bytes, then %v", abort, n, err)
	}
}

// waitQueued polls until c's send queue holds bytes the peer has not taken (SIOCOUTQ).
func waitQueued(t *testing.T, c *net.TCPConn) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var queued int
		rc.Control(func(fd uintptr) { queued, _ = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }) //nolint:errcheck
		if queued >= 32<<10 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the send queue holds %d bytes after 10 s", queued)
		}
		time.Sleep(time.Millisecond) // polling the socket's state, not synchronising
	}
}
