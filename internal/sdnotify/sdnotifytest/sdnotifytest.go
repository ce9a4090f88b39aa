// Package sdnotifytest plays systemd's side of sd_notify in tests: it points NOTIFY_SOCKET at a
// datagram socket and hands back what the code under test sends.
package sdnotifytest

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Socket is a NOTIFY_SOCKET the test reads.
type Socket struct {
	t    testing.TB
	conn *net.UnixConn
}

// Listen creates the socket and sets NOTIFY_SOCKET for the rest of the test.
func Listen(t testing.TB) *Socket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return &Socket{t: t, conn: conn}
}

// Receive returns the next message, failing the test if none arrives within 10 s.
func (s *Socket) Receive() string {
	s.t.Helper()
	buf := make([]byte, 4096)
	_ = s.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := s.conn.Read(buf)
	if err != nil {
		s.t.Fatalf("no sd_notify message: %v", err)
	}
	return string(buf[:n])
}

// ReceiveFDs returns the next message and the descriptors it carried (SCM_RIGHTS), failing the
// test if none arrives within 10 s. The descriptors are the test's to close.
func (s *Socket) ReceiveFDs() (string, []int) {
	s.t.Helper()
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(64*4))
	_ = s.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, oobn, _, _, err := s.conn.ReadMsgUnix(buf, oob)
	if err != nil {
		s.t.Fatalf("no sd_notify message: %v", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		s.t.Fatalf("sd_notify control message: %v", err)
	}
	var fds []int
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			s.t.Fatalf("sd_notify control message: %v", err)
		}
		fds = append(fds, got...)
	}
	return string(buf[:n]), fds
}
