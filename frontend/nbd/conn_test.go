package nbd

import (
	"net"
	"syscall"
	"testing"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// TestReplySocketBuffer: the client's socket gets the larger send buffer (a 1 MiB reply in one
// writev), as far as net.core.wmem_max allows.
func TestReplySocketBuffer(t *testing.T) {
	nc, remote, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	defer nc.Close()
	before := sndbuf(t, nc)
	newConn(&Server{log: zap.NewNop()}, nc)
	after := sndbuf(t, nc)
	want := replySocketBuffer // Linux doubles what is asked, up to twice wmem_max
	if after < want && after <= before {
		t.Fatalf("SO_SNDBUF %d after newConn (was %d), want at least %d", after, before, want)
	}
}

func sndbuf(t *testing.T, nc net.Conn) int {
	t.Helper()
	rc, err := nc.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var serr error
	if err := rc.Control(func(fd uintptr) { v, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF) }); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	return v
}
