package nbd

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/block"
)

// pipeDevice is a submitDevice that also takes reads into a pipe (block.PipeSubmitter), held until
// Kick like the submitted ones: the data is read with ReadAt and written into the pipe. Reads at
// or above failFrom put half their data into the pipe and then fail, leaving the pipe dirty.
type pipeDevice struct {
	*submitDevice
	piped atomic.Int64
}

func (d *pipeDevice) SubmitReadToPipe(ctx context.Context, pipe block.Pipe, n int, off int64, done block.Completion) bool {
	if off >= d.declineFrom {
		return false
	}
	d.piped.Add(1)
	d.mu.Lock()
	d.held = append(d.held, func() {
		buf := make([]byte, n)
		err := d.Device.ReadAt(ctx, buf, off)
		if err == nil && off >= d.failFrom {
			buf, err = buf[:n/2], fmt.Errorf("test: %w", block.ErrMedium)
		}
		for b := buf; len(b) > 0; {
			k, werr := unix.Write(pipe.W, b)
			if werr != nil {
				err = werr
				break
			}
			b = b[k:]
		}
		done.Complete(err)
	})
	d.mu.Unlock()
	return true
}

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// rawReply reads one reply to a request of length n off the wire as bytes.
func rawReply(c *testClient, n int) ([]byte, error) {
	if !c.structured {
		h := make([]byte, 16)
		if _, err := io.ReadFull(c.br, h); err != nil {
			return nil, err
		}
		if binary.BigEndian.Uint32(h[4:8]) != 0 {
			return h, nil
		}
		body := make([]byte, n)
		_, err := io.ReadFull(c.br, body)
		return append(h, body...), err
	}
	h := make([]byte, 20)
	if _, err := io.ReadFull(c.br, h); err != nil {
		return nil, err
	}
	body := make([]byte, binary.BigEndian.Uint32(h[16:20]))
	_, err := io.ReadFull(c.br, body)
	return append(h, body...), err
}

// TestSplicedReadsWire: READs the device puts into a pipe are answered with exactly the bytes the
// buffered path sends (simple and structured replies, successes and errors, reads too small to
// splice), and every pipe and byte of budget is given back on every path, including a client
// that disappears with spliced reads in flight.
func TestSplicedReadsWire(t *testing.T) {
	const failFrom = 12 << 20
	reads := []struct {
		off uint64
		n   uint32
	}{
		{0, 4096},                // below minSpliceRead: buffered
		{4096, 64 << 10},         // the smallest spliced read
		{1 << 20, 1 << 20},       // a whole segment
		{3 << 20, 256<<10 + 512}, // odd length
		{failFrom, 128 << 10},    // fails with half its data in the pipe
		{5 << 20, 1 << 20},       // after the failure: a fresh pipe
		{failFrom + 4096, 4096},  // a small failing read (the plain submitted path)
	}
	mem := newMem(t, 16<<20, "")
	data := make([]byte, 16<<20)
	rand.Read(data)
	if err := mem.WriteAt(context.Background(), data, 0, 0); err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, dev block.Device, structured, noSplice bool) [][]byte {
		fds := openFDs(t)
		srv, err := NewServer(dev, Options{MaxInflight: 8, PayloadBudget: 4 << 20, Splice: !noSplice})
		if err != nil {
			t.Fatal(err)
		}
		f := startServerWith(t, srv)
		c := f.dial().connect(structured)
		var out [][]byte
		for i, r := range reads {
			if err := c.send(cmdRead, 0, uint64(i), r.off, r.n, nil); err != nil {
				t.Fatal(err)
			}
			b, err := rawReply(c, int(r.n))
			if err != nil {
				t.Fatalf("read %d: %v", i, err)
			}
			out = append(out, b)
		}
		// Spliced reads in flight when the client vanishes.
		for i := range 4 {
			if err := c.send(cmdRead, 0, uint64(100+i), uint64(i)<<20, 1<<20, nil); err != nil {
				t.Fatal(err)
			}
		}
		c.nc.Close()
		f.shutdown()
		if used := srv.budget.used; used != 0 {
			t.Errorf("%d bytes of budget still held", used)
		}
		if now := openFDs(t); now > fds {
			t.Errorf("%d file descriptors open after the server ended, %d before (a pipe leaked)", now, fds)
		}
		return out
	}
	for _, structured := range []bool{false, true} {
		t.Run(fmt.Sprintf("structured=%v", structured), func(t *testing.T) {
			// The same pipe-capable device with splicing off gives the buffered replies.
			pd := &pipeDevice{submitDevice: &submitDevice{Device: mem, declineFrom: 1 << 62, failFrom: failFrom}}
			want := run(t, pd, structured, true)
			if n := pd.piped.Load(); n != 0 {
				t.Fatalf("Splice off: %d reads went through the pipe", n)
			}
			got := run(t, pd, structured, false)
			if pd.piped.Load() < 5 {
				t.Fatalf("%d reads went through the pipe, want at least 5", pd.piped.Load())
			}
			for i := range want {
				if string(got[i]) != string(want[i]) {
					t.Fatalf("read %d (%d bytes at %d): spliced reply (%d bytes) differs from the buffered one (%d bytes)",
						i, reads[i].n, reads[i].off, len(got[i]), len(want[i]))
				}
			}
			// And the buffered reply is right: the data, or EIO for the failing range.
			for i, r := range reads {
				hdr := 16
				if structured {
					hdr = 28
				}
				if r.off >= failFrom {
					if len(want[i]) >= hdr+int(r.n) {
						t.Fatalf("read %d in the failing range answered with data", i)
					}
					continue
				}
				if string(want[i][hdr:]) != string(data[r.off:r.off+uint64(r.n)]) {
					t.Fatalf("read %d returned the wrong bytes", i)
				}
			}
		})
	}
}

// startServerWith is startServer for a server built by the caller; shutdown ends it early.
func startServerWith(t *testing.T, srv *Server) *shutdownFixture {
	l, path := listenUnix(t)
	f := &shutdownFixture{fixture: fixture{t: t, srv: srv, path: path, errc: make(chan error, 1)}}
	go func() { f.errc <- srv.Serve(l) }()
	t.Cleanup(f.shutdown)
	return f
}

type shutdownFixture struct {
	fixture
	done bool
}

func (f *shutdownFixture) shutdown() {
	if f.done {
		return
	}
	f.done = true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.srv.Shutdown(ctx); err != nil {
		f.t.Errorf("shutdown: %v", err)
	}
	<-f.errc
}

func listenUnix(t *testing.T) (net.Listener, string) {
	path := filepath.Join(t.TempDir(), "nbd.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	return l, path
}
