package rawio

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestTryWritev: one writev that never waits in the poller. What fits goes out and rest is the
// exact suffix of bufs that did not (the same memory, its first buffer resliced), so that the
// caller can hand it to a goroutine that may wait; a full socket is not an error (rest is all of
// bufs); a peer that is gone is. The writer's deadline is the guard against waiting: a TryWritev
// that waited for the silent peer would end with os.ErrDeadlineExceeded instead of returning.
func TestTryWritev(t *testing.T) {
	const (
		sentAll = iota
		sentPart
		sentNone
	)
	many := make([]int, 256) // 4 KiB buffers, every third one empty: ~700 KiB in all
	for i := range many {
		if i%3 != 2 {
			many[i] = 4096
		}
	}
	tests := []struct {
		name      string
		sizes     []int // the buffers written, each of distinct bytes
		smallBuf  bool  // the writer's SO_SNDBUF at the kernel's minimum, a few KiB
		fill      bool  // the socket is full before the call
		closePeer bool  // the peer closed its end before the call
		want      int   // sentAll, sentPart or sentNone (with the error for closePeer)
	}{
		{name: "fits", sizes: []int{16, 0, 4096, 0, 100}, want: sentAll},
		{name: "only empty buffers", sizes: []int{0, 0}, want: sentAll},
		{name: "no buffers", want: sentAll},
		{name: "more than the socket takes", sizes: many, smallBuf: true, want: sentPart},
		{name: "one buffer larger than the socket takes", sizes: []int{1 << 20}, smallBuf: true, want: sentPart},
		{name: "socket already full", sizes: []int{0, 16, 4096}, smallBuf: true, fill: true, want: sentNone},
		{name: "peer closed", sizes: []int{16, 4096}, closePeer: true, want: sentNone},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := pairs(t)["unix"]
			w, peer := p[0].(*net.UnixConn), p[1]
			if tc.smallBuf {
				if err := w.SetWriteBuffer(1); err != nil {
					t.Fatal(err)
				}
			}
			var prefilled int
			if tc.fill {
				prefilled = fillSocket(t, w)
			}
			if tc.closePeer {
				peer.Close()
			}
			bufs, want := distinctBuffers(tc.sizes)
			orig := append([][]byte(nil), bufs...) // TryWritev reslices the elements of bufs
			if err := w.SetWriteDeadline(time.Now().Add(10 * time.Second)); err != nil {
				t.Fatal(err)
			}

			c := New(w)
			rest, err := c.TryWritev(bufs)

			if tc.closePeer {
				var oe *net.OpError
				if !errors.As(err, &oe) || oe.Op != "write" || !errors.Is(err, syscall.EPIPE) {
					t.Fatalf("TryWritev to a closed peer = %v, want a *net.OpError for write wrapping EPIPE", err)
				}
			} else if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("TryWritev waited for the socket until the deadline: %v", err)
			} else if err != nil {
				t.Fatalf("TryWritev = %v, want nil", err)
			}
			written := len(want) - restLen(rest)
			switch {
			case tc.want == sentAll && written != len(want),
				tc.want == sentPart && (written == 0 || written == len(want)),
				tc.want == sentNone && written != 0:
				t.Fatalf("TryWritev wrote %d of %d bytes; want case %d (0: all, 1: part, 2: none)", written, len(want), tc.want)
			}
			checkSuffix(t, orig, rest, written)
			if tc.closePeer {
				return
			}
			// The stream must be the prefill, then exactly the bytes of bufs: what TryWritev
			// wrote, then rest (sent now with Writev while the peer reads).
			if err := w.SetWriteDeadline(time.Time{}); err != nil {
				t.Fatal(err)
			}
			got := make(chan []byte, 1)
			go func() {
				b, _ := io.ReadAll(peer)
				got <- b
			}()
			if _, err := c.Writev(rest); err != nil {
				t.Fatalf("Writev of the rest: %v", err)
			}
			w.Close()
			stream := <-got
			if len(stream) != prefilled+len(want) || !bytes.Equal(stream[prefilled:], want) {
				t.Fatalf("the peer read %d bytes, want %d of prefill and then the %d bytes of bufs", len(stream), prefilled, len(want))
			}
		})
	}
}

// TestTryWritevNeedsRawFD: without a raw fd (net.Pipe) TryWritev writes nothing and says so.
func TestTryWritevNeedsRawFD(t *testing.T) {
	p := pairs(t)["pipe"]
	bufs := [][]byte{[]byte("abc")}
	rest, err := New(p[0]).TryWritev(bufs)
	if !errors.Is(err, errNoRawFD) || len(rest) != 1 || &rest[0][0] != &bufs[0][0] {
		t.Fatalf("TryWritev on net.Pipe = %d buffers, %v; want all of bufs and errNoRawFD", len(rest), err)
	}
}

// distinctBuffers returns buffers of the given sizes whose bytes differ from buffer to buffer
// and within each (so a misplaced or repeated range shows), and their concatenation.
func distinctBuffers(sizes []int) (bufs [][]byte, all []byte) {
	for i, n := range sizes {
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(i*31 + j*7 + j>>8)
		}
		bufs = append(bufs, b)
		all = append(all, b...)
	}
	return bufs, all
}

func restLen(rest [][]byte) int {
	n := 0
	for _, b := range rest {
		n += len(b)
	}
	return n
}

// checkSuffix fails t unless rest is orig after its first written bytes, sharing orig's memory:
// the first non-empty buffer at or after that offset, resliced, then every buffer after it.
func checkSuffix(t *testing.T, orig, rest [][]byte, written int) {
	t.Helper()
	var want [][]byte
	for i, b := range orig {
		if written < len(b) {
			want = append([][]byte{b[written:]}, orig[i+1:]...)
			break
		}
		written -= len(b)
	}
	if len(rest) != len(want) {
		t.Fatalf("rest has %d buffers, want %d (the suffix of bufs)", len(rest), len(want))
	}
	for k := range rest {
		if len(rest[k]) != len(want[k]) || len(rest[k]) > 0 && &rest[k][0] != &want[k][0] {
			t.Fatalf("rest[%d] is %d bytes that are not bufs' suffix (%d bytes) in place", k, len(rest[k]), len(want[k]))
		}
	}
}

// fillSocket writes to the non-blocking socket w with write(2) until it would block (EAGAIN),
// and returns how many (zero) bytes it wrote.
func fillSocket(t *testing.T, w *net.UnixConn) int {
	t.Helper()
	rc, err := w.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 4096)
	total := 0
	var werr error
	err = rc.Control(func(fd uintptr) {
		for {
			n, err := unix.Write(int(fd), chunk)
			if err == unix.EAGAIN {
				return
			}
			if err != nil {
				werr = err
				return
			}
			total += n
		}
	})
	if err != nil || werr != nil || total == 0 {
		t.Fatalf("filling the socket: wrote %d bytes, %v, %v", total, err, werr)
	}
	return total
}
