//go:build linux

package nbd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// handedDown makes n socket pairs and returns their server ends duplicated as an exec would pass
// them (dupForExec), and the client ends.
func handedDown(t *testing.T, n int) (fds []int, clients []net.Conn) {
	t.Helper()
	for range n {
		local, client := connectedPair(t)
		fd, err := dupForExec(local)
		local.Close()
		if err != nil {
			t.Fatal(err)
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC != 0 {
			t.Fatalf("descriptor %d: flags %#x, %v; want close-on-exec clear", fd, flags, err)
		}
		fds = append(fds, fd)
		clients = append(clients, client)
		t.Cleanup(func() { client.Close() })
	}
	return fds, clients
}

func inode(t *testing.T, fd int) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// execSurvivors counts this process's descriptors of the socket with inode ino that an exec
// would keep (close-on-exec clear).
func execSurvivors(t *testing.T, ino uint64) int {
	t.Helper()
	n := 0
	for _, fd := range descriptorsOf(t, ino) {
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			n++
		}
	}
	return n
}

// descriptorsOf lists this process's descriptors of the socket with inode ino.
func descriptorsOf(t *testing.T, ino uint64) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var fds []int
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil && st.Ino == ino {
			fds = append(fds, fd)
		}
	}
	return fds
}

func fdOf(t *testing.T, c net.Conn) uintptr {
	t.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd uintptr
	if err := rc.Control(func(s uintptr) { fd = s }); err != nil {
		t.Fatal(err)
	}
	return fd
}

func isOpen(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	return err == nil
}

func TestInheritedSocketsAreServedOnlyForTheirDevice(t *testing.T) {
	t.Run("ours, this device", func(t *testing.T) {
		fds, clients := handedDown(t, 2)
		inodes := []uint64{inode(t, fds[0]), inode(t, fds[1])}
		t.Setenv(InheritedSocketsEnv, fmt.Sprintf("5:%d,%d", fds[0], fds[1]))
		conns := inheritedSockets(5, 2, zap.NewNop())
		if len(conns) != 2 {
			t.Fatalf("%d connections, want 2", len(conns))
		}
		if _, ok := os.LookupEnv(InheritedSocketsEnv); ok {
			t.Fatal("the entry is still in the environment")
		}
		for i, c := range conns {
			defer c.Close()
			if n := execSurvivors(t, inodes[i]); n != 0 {
				t.Fatalf("socket %d: %d descriptors without close-on-exec left: the handed-down one was not closed", i, n)
			}
			if _, err := clients[i].Write([]byte{byte(i)}); err != nil {
				t.Fatal(err)
			}
			var b [1]byte
			if _, err := io.ReadFull(c, b[:]); err != nil || b[0] != byte(i) {
				t.Fatalf("connection %d: read %v, %v; want the byte its client wrote", i, b, err)
			}
		}
	})
	for _, tc := range []struct {
		name  string
		entry func(fds []int) string
	}{
		{"another device", func(fds []int) string { return fmt.Sprintf("6:%d,%d", fds[0], fds[1]) }},
		{"fewer than the connections", func(fds []int) string { return fmt.Sprintf("5:%d", fds[1]) }},
		{"malformed", func(fds []int) string { return fmt.Sprintf("5:x,%d", fds[1]) }},
		{"malformed device", func(fds []int) string { return fmt.Sprintf("five:%d", fds[1]) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fds, _ := handedDown(t, 2)
			entry := tc.entry(fds)
			if !strings.Contains(entry, strconv.Itoa(fds[0])) {
				unix.Close(fds[0]) // not listed: the test's to close
			}
			t.Setenv(InheritedSocketsEnv, entry)
			if conns := inheritedSockets(5, 2, zap.NewNop()); conns != nil {
				t.Fatalf("%d connections served from %q", len(conns), entry)
			}
			if isOpen(fds[1]) {
				t.Fatalf("our descriptor %d (listed after what was wrong) stays open: the kernel would never see that connection die", fds[1])
			}
		})
	}
	t.Run("the kernel closed one", func(t *testing.T) {
		fds, clients := handedDown(t, 2)
		clients[1].Close() // as nbd_xmit_timeout's shutdown of the kernel's end
		t.Setenv(InheritedSocketsEnv, fmt.Sprintf("5:%d,%d", fds[0], fds[1]))
		if conns := inheritedSockets(5, 2, zap.NewNop()); conns != nil {
			t.Fatal("a connection the kernel closed was served: it would end at once, and the device with it")
		}
		if isOpen(fds[0]) || isOpen(fds[1]) {
			t.Fatal("our descriptors stay open: the kernel would not see the live one die and take new sockets")
		}
	})
	t.Run("not ours", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		defer w.Close()
		t.Setenv(InheritedSocketsEnv, fmt.Sprintf("5:%d", r.Fd()))
		if conns := inheritedSockets(5, 1, zap.NewNop()); conns != nil {
			t.Fatal("a pipe was served as a connection")
		}
		if !isOpen(int(r.Fd())) {
			t.Fatal("a descriptor that is not ours was closed")
		}
	})
}

// A new device (Attach) closes the sockets a previous image handed down: their device then sees
// its connections die instead of waiting for sockets nobody reads.
func TestDropInheritedSocketsClosesOurs(t *testing.T) {
	fds, clients := handedDown(t, 1)
	t.Setenv(InheritedSocketsEnv, fmt.Sprintf("2:%d", fds[0]))
	dropInheritedSockets(zap.NewNop())
	if isOpen(fds[0]) {
		t.Fatal("the handed-down socket is still open")
	}
	if _, err := clients[0].Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the peer reads %v, want EOF", err)
	}
}

// A restart's pause and hand-down on an attachment whose kernel closed one connection: the pause
// does not wait for the closed one, and only the live socket is handed down (the next image,
// finding fewer sockets than connections, gives the device new ones).
func TestAttachmentPauseAndHandDown(t *testing.T) {
	_, srv, _ := intakeConn(t) // a server to attach; its own connection is not the attachment's
	a := &Attachment{srv: srv, index: 3, viaNetlink: true, log: zap.NewNop(), done: make(chan struct{})}
	local0, client0 := connectedPair(t)
	local1, client1 := connectedPair(t)
	defer client0.Close()
	// what serve does, with the connections known as they start
	started := make(chan *conn, 2)
	for _, l := range []net.Conn{local0, local1} {
		a.conns.Add(1)
		go func() {
			defer a.conns.Done()
			srv.serveTransmission(l, func(c *conn) { a.track(c); started <- c })
		}()
	}
	go func() { a.conns.Wait(); close(a.done) }()
	a.connected.Store(true)
	c0, c1 := <-started, <-started
	if c0.nc != local0 {
		c0, c1 = c1, c0
	}
	ended := c1.ended
	client1.Close() // the kernel closes connection 1
	<-ended
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.PauseIntake(ctx); err != nil {
		t.Fatalf("pause with one connection closed: %v", err)
	}
	entry, err := a.ExecSockets()
	if err != nil {
		t.Fatal(err)
	}
	name, value, _ := strings.Cut(entry, "=")
	if name != InheritedSocketsEnv || !strings.HasPrefix(value, "3:") || strings.Contains(value, ",") {
		t.Fatalf("handed down %q; want device 3's one live socket", entry)
	}
	t.Setenv(InheritedSocketsEnv, value)
	conns := inheritedSockets(3, 1, zap.NewNop())
	if len(conns) != 1 {
		t.Fatalf("%d connections taken from %q, want 1", len(conns), value)
	}
	defer conns[0].Close()
	// the handed-down socket is connection 0's: what its client sends now reaches it
	if _, err := client0.Write([]byte{42}); err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	if _, err := io.ReadFull(conns[0], b[:]); err != nil || b[0] != 42 {
		t.Fatalf("read %v, %v through the handed-down socket; want 42", b, err)
	}
	// the same sockets for a descriptor store: named after the device and this process, the
	// live one only, this process's copies closed once the store has its own
	var storedName string
	var storedInodes []uint64
	err = a.StoreSockets(func(name string, fds []int) error {
		storedName = name
		for _, fd := range fds {
			storedInodes = append(storedInodes, inode(t, fd))
		}
		return nil
	})
	ino0 := inode(t, int(fdOf(t, local0)))
	if err != nil || storedName != StoredSocketsName(3, os.Getpid()) || !slices.Equal(storedInodes, []uint64{ino0}) {
		t.Fatalf("stored %q %v, %v; want %q with connection 0's socket (inode %d)", storedName, storedInodes, err, StoredSocketsName(3, os.Getpid()), ino0)
	}
	if n := len(descriptorsOf(t, ino0)); n != 2 {
		t.Fatalf("%d descriptors of connection 0's socket in this process, want 2 (the connection's, the one handed down above): the copy made for the store stays open", n)
	}
	a.ResumeIntake()
}

// Sockets a descriptor store passed are served when they are as many live unix stream sockets as
// connections; otherwise every one is closed, so that the kernel sees its connections die and
// takes the new sockets NBD_CMD_RECONFIGURE gives it.
func TestStoredSocketsAreServedOnlyWhenLive(t *testing.T) {
	stored := func(t *testing.T, n int) ([]*os.File, []net.Conn) {
		fds, clients := handedDown(t, n)
		files := make([]*os.File, n)
		for i, fd := range fds {
			files[i] = os.NewFile(uintptr(fd), "nbd5-pid1")
		}
		return files, clients
	}
	allClosed := func(t *testing.T, files []*os.File) {
		t.Helper()
		for i, f := range files {
			if !errors.Is(f.Close(), os.ErrClosed) {
				t.Fatalf("stored file %d left open", i)
			}
		}
	}
	wantEOF := func(t *testing.T, c net.Conn) {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("the kernel's end reads %v, want EOF: a socket not served stays open", err)
		}
	}
	t.Run("live", func(t *testing.T) {
		files, clients := stored(t, 2)
		conns := storedSockets(files, 2, zap.NewNop())
		if len(conns) != 2 {
			t.Fatalf("%d connections, want 2", len(conns))
		}
		allClosed(t, files)
		for i, c := range conns {
			defer c.Close()
			if _, err := clients[i].Write([]byte{byte(i + 7)}); err != nil {
				t.Fatal(err)
			}
			var b [1]byte
			if _, err := io.ReadFull(c, b[:]); err != nil || b[0] != byte(i+7) {
				t.Fatalf("connection %d: read %v, %v", i, b, err)
			}
		}
	})
	t.Run("fewer than the connections", func(t *testing.T) {
		files, clients := stored(t, 1)
		if conns := storedSockets(files, 2, zap.NewNop()); conns != nil {
			t.Fatalf("%d connections served for 2", len(conns))
		}
		allClosed(t, files)
		wantEOF(t, clients[0])
	})
	t.Run("the kernel closed one", func(t *testing.T) {
		files, clients := stored(t, 2)
		clients[1].Close()
		if conns := storedSockets(files, 2, zap.NewNop()); conns != nil {
			t.Fatal("a connection the kernel closed was served")
		}
		allClosed(t, files)
		wantEOF(t, clients[0])
	})
	t.Run("not a socket", func(t *testing.T) {
		files, clients := stored(t, 1)
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		files = append(files, r)
		if conns := storedSockets(files, 2, zap.NewNop()); conns != nil {
			t.Fatal("a pipe was served as a connection")
		}
		allClosed(t, files)
		wantEOF(t, clients[0])
	})
	t.Run("none", func(t *testing.T) {
		if conns := storedSockets(nil, 1, zap.NewNop()); conns != nil {
			t.Fatal("connections from nothing")
		}
	})
}

// The hand-down across exec names the process that made the sockets: sockets made by another
// than the one named are not served (nor closed: not known to be ours).
func TestInheritedSocketsNameTheirMaker(t *testing.T) {
	t.Run("this process, named", func(t *testing.T) {
		fds, _ := handedDown(t, 1)
		t.Setenv(InheritedSocketsEnv, fmt.Sprintf("5:%d:%d", fds[0], os.Getpid()))
		conns := inheritedSockets(5, 1, zap.NewNop())
		if len(conns) != 1 {
			t.Fatalf("%d connections, want 1", len(conns))
		}
		conns[0].Close()
	})
	t.Run("another process", func(t *testing.T) {
		fds, _ := handedDown(t, 1)
		t.Setenv(InheritedSocketsEnv, fmt.Sprintf("5:%d:1", fds[0]))
		if conns := inheritedSockets(5, 1, zap.NewNop()); conns != nil {
			t.Fatal("served sockets whose maker is not process 1")
		}
		if !isOpen(fds[0]) {
			t.Fatal("closed a descriptor not known to be ours")
		}
		unix.Close(fds[0])
	})
	for _, maker := range []string{"x", "0"} {
		t.Run("malformed "+maker, func(t *testing.T) {
			fds, _ := handedDown(t, 1)
			t.Setenv(InheritedSocketsEnv, fmt.Sprintf("5:%d:%s", fds[0], maker))
			if conns := inheritedSockets(5, 1, zap.NewNop()); conns != nil {
				t.Fatalf("served sockets from a malformed entry (maker %q)", maker)
			}
			if isOpen(fds[0]) {
				t.Fatal("our descriptor stays open after a malformed entry")
			}
		})
	}
}
