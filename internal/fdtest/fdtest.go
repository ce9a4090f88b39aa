// Package fdtest holds file-descriptor fixtures for tests: non-blocking pipes like the ones the
// spliced read path uses, and connected socket pairs (real kernel sockets, so that code taking the
// raw-fd paths — writev, splice, package rawio — runs them, which net.Pipe would not). Only test
// files import it; everything it creates is closed when the test ends.
package fdtest

import (
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

// Pipe returns a non-blocking, close-on-exec pipe of at least size bytes.
func Pipe(t testing.TB, size int) (r, w int) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	if _, err := unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, size); err != nil {
		t.Fatalf("F_SETPIPE_SZ %d: %v", size, err)
	}
	return p[0], p[1]
}

// Drain reads everything the non-blocking pipe r holds now.
func Drain(t testing.TB, r int) []byte {
	t.Helper()
	var out []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(r, buf)
		if err == unix.EAGAIN || n == 0 {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, buf[:n]...)
	}
}

// Pair returns the two ends of one connection on a fresh listener: network "tcp" (addr
// "127.0.0.1:0") or "unix" (a socket path).
func Pair(t testing.TB, network, addr string) (dialed, accepted net.Conn) {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		c   net.Conn
		err error
	}
	acc := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		acc <- result{c, err}
	}()
	a, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-acc
	if b.err != nil {
		a.Close()
		t.Fatal(b.err)
	}
	t.Cleanup(func() { a.Close(); b.c.Close() })
	return a, b.c
}

// TCPPair is Pair over loopback TCP.
func TCPPair(t testing.TB) (dialed, accepted net.Conn) {
	t.Helper()
	return Pair(t, "tcp", "127.0.0.1:0")
}
