package nbd

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/pool"
)

// runDevice completes what SubmitAt started the way the iSCSI session's reader does: one
// goroutine takes what each Kick released as one run, completes it with CompleteBatched and then
// flushes every distinct Flusher it got back (block.BatchCompletion). So the replies are written
// by the reply writer goroutine that Flush wakes, not by a worker. After warm-up it allocates
// nothing.
type runDevice struct {
	block.Device
	mu      sync.Mutex
	held    []submitted // started, not yet kicked
	kicked  []submitted // kicked, for the completer
	wake    chan struct{}
	stopped chan struct{}
	// completed counts the requests completed through SubmitAt, so that a test can check its
	// requests took that path and not a worker's
	completed atomic.Int64
}

type submitted struct {
	p     []byte
	off   int64
	write bool
	done  block.Completion
}

func newRunDevice(dev block.Device) *runDevice {
	d := &runDevice{Device: dev, wake: make(chan struct{}, 1), stopped: make(chan struct{})}
	go d.complete()
	return d
}

func (d *runDevice) SubmitAt(_ context.Context, p []byte, off int64, write bool, _ block.WriteFlags, done block.Completion) bool {
	d.mu.Lock()
	d.held = append(d.held, submitted{p, off, write, done})
	d.mu.Unlock()
	return true
}

func (d *runDevice) Kick() {
	d.mu.Lock()
	d.kicked = append(d.kicked, d.held...)
	clear(d.held)
	d.held = d.held[:0]
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *runDevice) complete() {
	defer close(d.stopped)
	var run []submitted
	var flushers []block.Flusher
	ctx := context.Background()
	for range d.wake {
		d.mu.Lock()
		run, d.kicked = d.kicked, run[:0]
		d.mu.Unlock()
		for _, s := range run {
			var err error
			if s.write {
				err = d.Device.WriteAt(ctx, s.p, s.off, 0)
			} else {
				err = d.Device.ReadAt(ctx, s.p, s.off)
			}
			if f := block.CompleteBatched(s.done, err); f != nil && !slices.Contains(flushers, f) {
				flushers = append(flushers, f)
			}
		}
		d.completed.Add(int64(len(run)))
		for _, f := range flushers {
			f.Flush()
		}
		clear(flushers)
		flushers = flushers[:0]
		clear(run)
	}
}

func (d *runDevice) Close() error {
	close(d.wake)
	<-d.stopped
	return d.Device.Close()
}

// serveRunDevice serves dev, wrapped in a runDevice, to one client on a socketpair (transmission
// phase), and returns the client's end, the connection once it has ended, and the runDevice.
// setup runs on the connection before transmission.
func serveRunDevice(t testing.TB, dev block.Device, opts Options, structured bool, setup func(*conn)) (net.Conn, <-chan *conn, *runDevice) {
	t.Helper()
	rd := newRunDevice(dev)
	t.Cleanup(func() { rd.Close() })
	srv, err := NewServer(rd, opts)
	if err != nil {
		t.Fatal(err)
	}
	local, nc := connectedPair(t)
	done := make(chan *conn, 1)
	srv.startConn(local, func(c *conn) {
		setup(c)
		c.exp = srv.export(structured)
		c.transmit()
		done <- c
	})
	t.Cleanup(func() { nc.Close(); srv.Close() })
	return nc, done, rd
}

// slowConn hands the client at most 1 KiB per Read, so that the server's socket stays full
// longer and its writer waits for room more often.
type slowConn struct{ net.Conn }

func (c slowConn) Read(p []byte) (int, error) {
	return c.Conn.Read(p[:min(len(p), 1024)])
}

// TestRepliesOnAFullSocket: when the reply writer's socket stays full (a send buffer of a few
// KiB, a client that reads slowly), every reply still arrives once, whole and uninterleaved: the
// client parses the stream reply by reply and checks each READ's bytes against the device. Every
// request went through SubmitAt and a completion's Flush (runDevice counts them). Spliced READ
// replies have their own test (TestSplicedReadsWire).
func TestRepliesOnAFullSocket(t *testing.T) {
	for _, structured := range []bool{false, true} {
		t.Run(fmt.Sprintf("structured=%v", structured), func(t *testing.T) {
			repliesOnAFullSocket(t, structured)
		})
	}
}

// repliesOnAFullSocket runs the exchange for TestRepliesOnAFullSocket.
func repliesOnAFullSocket(t *testing.T, structured bool) {
	const size = 8 << 20
	mem := newMem(t, size, "")
	content := make([]byte, size)
	rand.Read(content)
	if err := mem.WriteAt(context.Background(), content, 0, 0); err != nil {
		t.Fatal(err)
	}
	nc, done, rd := serveRunDevice(t, mem, Options{MaxInflight: 32}, structured, func(c *conn) {
		// After newConn's SetWriteBuffer: the kernel's minimum send buffer, a few KiB.
		if err := c.nc.(*net.UnixConn).SetWriteBuffer(1); err != nil {
			t.Error(err)
		}
	})
	client := newTestClient(t, slowConn{nc})

	// Rounds of 1 to 8 requests, each round's replies read before the next is sent, so that a
	// completion finds the writer role free again: READs of 4 KiB to 64 KiB (most of them
	// larger than the send buffer) and a WRITE every fifth (a reply without payload), all
	// through SubmitAt. Replies within a round may come in any order.
	type req struct {
		off    uint64
		length int
		write  bool
	}
	reqs := map[uint64]req{}
	readLen := func(h uint64) int {
		if reqs[h].write {
			return 0
		}
		return reqs[h].length
	}
	var sent int64
	for i, round := uint64(0), 0; i < 600; round++ {
		clear(reqs)
		for range 1 + round%8 {
			q := req{length: 4096 * (1 + int(i*7)%16), off: (i * 40960) % (size - 64<<10), write: i%5 == 4}
			reqs[i] = q
			var err error
			if q.write {
				err = client.send(cmdWrite, 0, i, q.off, uint32(q.length), content[q.off:q.off+uint64(q.length)])
			} else {
				err = client.send(cmdRead, 0, i, q.off, uint32(q.length), nil)
			}
			if err != nil {
				t.Fatal(err)
			}
			i++
			sent++
		}
		for pending := len(reqs); pending > 0; pending-- {
			r, err := client.readReply(readLen)
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			q, ok := reqs[r.handle]
			switch {
			case !ok || r.errno != 0 || (structured && !q.write) != r.structured:
				t.Fatalf("round %d: reply %+v to a request not pending or failed", round, r)
			case !q.write && !bytes.Equal(r.data, content[q.off:q.off+uint64(q.length)]):
				t.Fatalf("reply %d: %d bytes that are not the device's %d at %d", r.handle, len(r.data), q.length, q.off)
			}
			delete(reqs, r.handle)
		}
	}
	nc.Close()
	<-done
	if n := rd.completed.Load(); n != sent {
		t.Fatalf("%d of the %d requests were completed through SubmitAt, want all", n, sent)
	}
}

// TestFlushPathAllocatesNothing: a 4 KiB READ or WRITE round trip completed in runs, whose reply
// the writer goroutine a completion's Flush woke sends, allocates nothing after warm-up
// (runtime-wide count, the server's goroutines and the completing device goroutine included).
func TestFlushPathAllocatesNothing(t *testing.T) {
	p, err := pool.New(pool.Config{MaxBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	for _, cmd := range []uint16{cmdRead, cmdWrite} {
		nc, done, rd := serveRunDevice(t, newMem(t, 8<<20, ""), Options{Pool: p}, false, func(*conn) {})
		req := make([]byte, requestHeaderLen+4096)
		reply := make([]byte, simpleReplyLen+4096)
		if cmd == cmdRead {
			req = req[:requestHeaderLen]
		} else {
			reply = reply[:simpleReplyLen]
		}
		if a := roundTripAllocs(t, nc, req, reply, cmd, 4096); a > 0.01 {
			t.Errorf("cmd %d: %.3f allocs per request, want 0", cmd, a)
		}
		nc.Close()
		<-done
		if n := rd.completed.Load(); n < 2500 { // 500 warm-up round trips and AllocsPerRun's 2000 and more
			t.Errorf("cmd %d: %d requests completed through SubmitAt and Flush, want every round trip's", cmd, n)
		}
	}
}

// connectedPair is socketPair with the remote end as a net.Conn, for a test's client: the server
// gets local.
func connectedPair(t testing.TB) (local, client net.Conn) {
	t.Helper()
	local, remote, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	client, err = net.FileConn(remote)
	remote.Close()
	if err != nil {
		t.Fatal(err)
	}
	return local, client
}
