package rawio

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/internal/fdtest"
)

func patternBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*131 + i>>9)
	}
	return b
}

// TestSpliceIn moves a socket's bytes into a pipe in several splices of at most limit bytes,
// then reports a pipe without room as ErrPipeFull (not a wait for the socket) and the peer's
// close as io.EOF.
func TestSpliceIn(t *testing.T) {
	for _, name := range []string{"tcp", "unix"} {
		t.Run(name, func(t *testing.T) {
			p := pairs(t)[name]
			src, c := p[0], New(p[1])
			pr, pw := fdtest.Pipe(t, 1<<20)
			want := patternBytes(300 << 10)
			errc := make(chan error, 1)
			go func() { _, err := src.Write(want); errc <- err }()
			var got []byte
			for len(got) < len(want) {
				limit := min(64<<10, len(want)-len(got))
				n, err := c.SpliceIn(pw, limit)
				if err != nil || n <= 0 || n > limit {
					t.Fatalf("SpliceIn(limit %d) after %d bytes = %d, %v", limit, len(got), n, err)
				}
				got = append(got, fdtest.Drain(t, pr)...)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("bytes differ after the pipe")
			}

			// A full pipe: fill it, give the socket bytes, and SpliceIn must say so at once.
			small, smallW := fdtest.Pipe(t, 4096)
			if _, err := WriteAll(smallW, make([]byte, 4096)); err != nil {
				t.Fatal(err)
			}
			if _, err := src.Write([]byte("more")); err != nil {
				t.Fatal(err)
			}
			if n, err := c.SpliceIn(smallW, 4); n != 0 || !errors.Is(err, ErrPipeFull) {
				t.Fatalf("SpliceIn into a full pipe = %d, %v; want 0, ErrPipeFull", n, err)
			}
			fdtest.Drain(t, small)
			if n, err := c.SpliceIn(pw, 4); n != 4 || err != nil {
				t.Fatalf("SpliceIn after the pipe drained = %d, %v", n, err)
			}
			if b := fdtest.Drain(t, pr); string(b) != "more" {
				t.Fatalf("pipe holds %q, want \"more\"", b)
			}

			src.Close()
			if n, err := c.SpliceIn(pw, 4); n != 0 || err != io.EOF {
				t.Fatalf("SpliceIn after the peer closed = %d, %v; want 0, io.EOF", n, err)
			}
		})
	}
}

// TestSpliceInDeadline: a SpliceIn waiting for an idle socket ends at the conn's deadline, as
// Read does.
func TestSpliceInDeadline(t *testing.T) {
	p := pairs(t)["tcp"]
	c := New(p[1])
	_, pw := fdtest.Pipe(t, 4096)
	if err := p[1].SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SpliceIn(pw, 4096); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("SpliceIn on an idle socket past its deadline = %v, want os.ErrDeadlineExceeded", err)
	}
}

// TestSpliceOut moves more than a socket buffer holds out of a pipe (so it waits for the reader),
// then reports a pipe holding less than asked for as ErrPipeShort with the count it did move.
func TestSpliceOut(t *testing.T) {
	for _, name := range []string{"tcp", "unix"} {
		t.Run(name, func(t *testing.T) {
			p := pairs(t)[name]
			c, dst := New(p[0]), p[1]
			pr, pw := fdtest.Pipe(t, 1<<20)
			want := patternBytes(1 << 20)
			if n, err := WriteAll(pw, want); n != len(want) || err != nil {
				t.Fatalf("filling the pipe: %d, %v", n, err)
			}
			got := make(chan []byte, 1)
			go func() {
				b := make([]byte, len(want)+3)
				n, _ := io.ReadFull(dst, b)
				got <- b[:n]
			}()
			if n, err := c.SpliceOut(pr, len(want)); n != len(want) || err != nil {
				t.Fatalf("SpliceOut = %d, %v", n, err)
			}
			if n, err := WriteAll(pw, []byte("abc")); n != 3 || err != nil {
				t.Fatal(n, err)
			}
			if n, err := c.SpliceOut(pr, 10); n != 3 || !errors.Is(err, ErrPipeShort) {
				t.Fatalf("SpliceOut of 10 bytes from a pipe holding 3 = %d, %v; want 3, ErrPipeShort", n, err)
			}
			if b := <-got; !bytes.Equal(b, append(want, "abc"...)) {
				t.Fatalf("peer read %d bytes, not the %d spliced", len(b), len(want)+3)
			}
		})
	}
}

// TestSpliceNeedsFD: without a raw fd (net.Pipe) both directions refuse instead of copying.
func TestSpliceNeedsFD(t *testing.T) {
	c := New(pairs(t)["pipe"][0])
	pr, pw := fdtest.Pipe(t, 4096)
	if _, err := c.SpliceIn(pw, 1); !errors.Is(err, errNotRaw) {
		t.Fatalf("SpliceIn on net.Pipe = %v", err)
	}
	if _, err := c.SpliceOut(pr, 1); !errors.Is(err, errNotRaw) {
		t.Fatalf("SpliceOut on net.Pipe = %v", err)
	}
}

// TestSpliceNoAllocs: a splice in each direction allocates nothing (the poller callbacks are
// method values made once in New).
func TestSpliceNoAllocs(t *testing.T) {
	p := pairs(t)["unix"]
	a, b := New(p[0]), New(p[1])
	pr, pw := fdtest.Pipe(t, 64<<10)
	buf := make([]byte, 4096)
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := WriteAll(pw, buf); err != nil {
			t.Fatal(err)
		}
		if n, err := a.SpliceOut(pr, len(buf)); n != len(buf) || err != nil {
			t.Fatal(n, err)
		}
		for moved := 0; moved < len(buf); {
			n, err := b.SpliceIn(pw, len(buf)-moved)
			if err != nil {
				t.Fatal(err)
			}
			moved += n
		}
		if _, err := unix.Read(pr, buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per splice round trip, want 0", allocs)
	}
}
