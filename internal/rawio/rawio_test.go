package rawio

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/internal/fdtest"
)

func pair(t testing.TB, network, addr string) [2]net.Conn {
	a, b := fdtest.Pair(t, network, addr)
	return [2]net.Conn{a, b}
}

// pairs returns connected socket pairs of each kind the gateway uses, plus net.Pipe (no raw fd).
func pairs(t testing.TB) map[string][2]net.Conn {
	t.Helper()
	out := map[string][2]net.Conn{
		"tcp":  pair(t, "tcp", "127.0.0.1:0"),
		"unix": pair(t, "unix", t.TempDir()+"/s"),
	}
	pa, pb := net.Pipe()
	out["pipe"] = [2]net.Conn{pa, pb}
	t.Cleanup(func() {
		for _, p := range out {
			p[0].Close()
			p[1].Close()
		}
	})
	return out
}

func TestRawOnlyWithFD(t *testing.T) {
	for name, p := range pairs(t) {
		if got, want := New(p[0]).Raw(), name != "pipe"; got != want {
			t.Errorf("%s: Raw() = %v, want %v", name, got, want)
		}
	}
}

// TestWritevRead sends more than a socket buffer holds, in many buffers (more than IOV_MAX, empty
// ones among them), so Writev must loop over short writes and wait for writability; the reader
// must see every byte in order and then io.EOF.
func TestWritevRead(t *testing.T) {
	for name, p := range pairs(t) {
		t.Run(name, func(t *testing.T) {
			w, r := New(p[0]), New(p[1])
			var bufs [][]byte
			var want bytes.Buffer
			for i := 0; i < 3000; i++ {
				n := (i * 7919) % 3001 // includes zero-length buffers
				b := bytes.Repeat([]byte{byte(i)}, n)
				bufs = append(bufs, b)
				want.Write(b)
			}
			var got bytes.Buffer
			var rerr error
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, rerr = io.Copy(&got, r)
			}()
			n, err := w.Writev(bufs)
			if err != nil {
				t.Fatalf("Writev: %v", err)
			}
			if n != int64(want.Len()) {
				t.Fatalf("Writev wrote %d bytes, want %d", n, want.Len())
			}
			p[0].Close()
			wg.Wait()
			if rerr != nil && !(name == "pipe" && errors.Is(rerr, io.ErrClosedPipe)) {
				t.Fatalf("read: %v", rerr)
			}
			if !bytes.Equal(got.Bytes(), want.Bytes()) {
				t.Fatalf("read %d bytes, differing from the %d written", got.Len(), want.Len())
			}
		})
	}
}

func TestReadEOF(t *testing.T) {
	for name, p := range pairs(t) {
		if name == "pipe" {
			continue // net.Pipe reports io.EOF too, but that is nc's own behaviour
		}
		r := New(p[1])
		if _, err := p[0].Write([]byte("abc")); err != nil {
			t.Fatal(err)
		}
		p[0].Close()
		buf := make([]byte, 8)
		n, err := r.Read(buf)
		if err != nil || string(buf[:n]) != "abc" {
			t.Fatalf("%s: Read = %q, %v; want \"abc\", nil", name, buf[:n], err)
		}
		if n, err := r.Read(buf); n != 0 || err != io.EOF {
			t.Fatalf("%s: Read at end = %d, %v; want 0, io.EOF", name, n, err)
		}
	}
}

// TestDeadlineAndClose: a read with nothing to read waits in the poller, so a deadline ends it
// with os.ErrDeadlineExceeded (a net.Error whose Timeout is true) and Close from another goroutine
// ends it with net.ErrClosed: the same errors net.Conn gives.
func TestDeadlineAndClose(t *testing.T) {
	for name, p := range pairs(t) {
		if name == "pipe" {
			continue
		}
		r := New(p[1])
		if err := p[1].SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		_, err := r.Read(make([]byte, 8))
		var ne net.Error
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("%s: Read past deadline = %v, want a timeout wrapping os.ErrDeadlineExceeded", name, err)
		}
		if err := p[1].SetReadDeadline(time.Time{}); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := r.Read(make([]byte, 8))
			done <- err
		}()
		// Whether Close lands before or while the read waits, the read ends with the same error.
		p[1].Close()
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Fatalf("%s: Read after Close = %v, want net.ErrClosed", name, err)
		}
	}
}

func TestWriteToClosedPeer(t *testing.T) {
	p := pairs(t)["unix"]
	w := New(p[0])
	p[1].Close()
	big := make([]byte, 4<<20)
	_, err := w.Writev([][]byte{big})
	var oe *net.OpError
	if err == nil || !errors.As(err, &oe) || oe.Op != "write" {
		t.Fatalf("Writev to a closed peer = %v, want a *net.OpError for write", err)
	}
}

// TestNoAllocs: the per-I/O read and vectored write allocate nothing.
func TestNoAllocs(t *testing.T) {
	p := pairs(t)["unix"]
	w, r := New(p[0]), New(p[1])
	hdr, data := make([]byte, 16), make([]byte, 4096)
	bufs := make([][]byte, 2)
	rbuf := make([]byte, len(hdr)+len(data))
	allocs := testing.AllocsPerRun(200, func() {
		bufs[0], bufs[1] = hdr, data
		if _, err := w.Writev(bufs); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(r, rbuf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per write+read, want 0", allocs)
	}
}

func BenchmarkWritevRead4K(b *testing.B) {
	p := pairs(b)["unix"]
	w, r := New(p[0]), New(p[1])
	hdr, data := make([]byte, 16), make([]byte, 4096)
	bufs := make([][]byte, 2)
	rbuf := make([]byte, len(hdr)+len(data))
	b.ReportAllocs()
	b.SetBytes(int64(len(rbuf)))
	for b.Loop() {
		bufs[0], bufs[1] = hdr, data
		if _, err := w.Writev(bufs); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(r, rbuf); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSpliceAndWrite moves bytes written into a pipe on into a socket with splice, and reports
// EAGAIN (not a wait) when the pipe is empty, as the callers' loops expect.
func TestSpliceAndWrite(t *testing.T) {
	p := pairs(t)["unix"]
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	if n, err := write(fds[1], []byte("spliced")); n != 7 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	f, err := p[0].(*net.UnixConn).File() // a dup, blocking mode: fine for 7 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n, err := splice(fds[0], int(f.Fd()), 64, unix.SPLICE_F_NONBLOCK); n != 7 || err != nil {
		t.Fatalf("Splice = %d, %v; want 7, nil", n, err)
	}
	if _, err := splice(fds[0], int(f.Fd()), 64, unix.SPLICE_F_NONBLOCK); err != unix.EAGAIN {
		t.Fatalf("Splice from an empty pipe = %v, want EAGAIN", err)
	}
	got := make([]byte, 7)
	if _, err := io.ReadFull(p[1], got); err != nil || string(got) != "spliced" {
		t.Fatalf("read %q, %v", got, err)
	}
}

// TestWriteAllFullPipe: WriteAll fills a pipe and, when it is full, reports EAGAIN with the count
// written, which the spliced-read fallback relies on to tell "full" from "done".
func TestWriteAllFullPipe(t *testing.T) {
	r, w := fdtest.Pipe(t, 64<<10)
	if n, err := WriteAll(w, make([]byte, 4096)); n != 4096 || err != nil {
		t.Fatalf("WriteAll into an empty pipe = %d, %v", n, err)
	}
	n, err := WriteAll(w, make([]byte, 1<<20))
	if err != unix.EAGAIN || n <= 0 || n >= 1<<20 {
		t.Fatalf("WriteAll of 1 MiB into a 64 KiB pipe = %d, %v; want a partial count and EAGAIN", n, err)
	}
	if got := len(fdtest.Drain(t, r)); got != 4096+n {
		t.Fatalf("pipe held %d bytes, want %d", got, 4096+n)
	}
}
