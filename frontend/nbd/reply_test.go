package nbd

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/iser-blk/iser-blk/block"
)

// runDevice completes what SubmitAt started the way the iSCSI session's reader does: one
// goroutine takes each Kick's requests as one run, completes them with CompleteBatched and then
// flushes every distinct Flusher it got back (block.BatchCompletion). So the replies are written
// by Flush's non-blocking writes, not by a worker.
type runDevice struct {
	block.Device
	mu   sync.Mutex
	held []func() error
	done []block.Completion
	runs chan run
}

type run struct {
	ops  []func() error
	done []block.Completion
}

func newRunDevice(dev block.Device) *runDevice {
	d := &runDevice{Device: dev, runs: make(chan run, 1024)}
	go d.complete()
	return d
}

func (d *runDevice) SubmitAt(ctx context.Context, p []byte, off int64, write bool, flags block.WriteFlags, done block.Completion) bool {
	op := func() error { return d.Device.ReadAt(ctx, p, off) }
	if write {
		op = func() error { return d.Device.WriteAt(ctx, p, off, flags) }
	}
	d.mu.Lock()
	d.held = append(d.held, op)
	d.done = append(d.done, done)
	d.mu.Unlock()
	return true
}

func (d *runDevice) Kick() {
	d.mu.Lock()
	r := run{ops: d.held, done: d.done}
	d.held, d.done = nil, nil
	d.mu.Unlock()
	if len(r.ops) > 0 {
		d.runs <- r
	}
}

func (d *runDevice) complete() {
	for r := range d.runs {
		var flushers []block.Flusher
		for i, op := range r.ops {
			if f := block.CompleteBatched(r.done[i], op()); f != nil {
				flushers = append(flushers, f)
			}
		}
		for _, f := range flushers {
			f.Flush()
		}
	}
}

func (d *runDevice) Close() error {
	close(d.runs)
	return d.Device.Close()
}

// slowConn hands the client at most 1 KiB per Read, so that the server's socket stays full
// longer and its writes come back partial or EAGAIN more often.
type slowConn struct{ net.Conn }

func (c slowConn) Read(p []byte) (int, error) {
	return c.Conn.Read(p[:min(len(p), 1024)])
}

// TestFlushPartialWrites: when the completing goroutine's non-blocking writes (Flush) find the
// socket full (a send buffer of a few KiB, a client that reads slowly), the reply writer
// goroutine sends what they left and every reply still arrives once, whole and uninterleaved:
// the client parses the stream reply by reply and checks each READ's bytes against the device.
func TestFlushPartialWrites(t *testing.T) {
	for _, structured := range []bool{false, true} {
		t.Run(fmt.Sprintf("structured=%v", structured), func(t *testing.T) {
			flushed, partial := flushPartialWrites(t, structured)
			if partial == 0 || flushed == 0 {
				t.Fatalf("flushed %d replies whole, %d partial writes: the test did not exercise both paths", flushed, partial)
			}
			t.Logf("flushed %d replies whole, %d partial writes", flushed, partial)
		})
	}
}

// flushPartialWrites runs the exchange for TestFlushPartialWrites and returns the connection's
// counters of replies Flush sent whole and of its partial writes.
func flushPartialWrites(t *testing.T, structured bool) (flushed, partial int64) {
	const size = 8 << 20
	mem := newMem(t, size, "")
	content := make([]byte, size)
	rand.Read(content)
	if err := mem.WriteAt(context.Background(), content, 0, 0); err != nil {
		t.Fatal(err)
	}
	dev := newRunDevice(mem)
	srv, err := NewServer(dev, Options{MaxInflight: 32})
	if err != nil {
		t.Fatal(err)
	}
	local, remote, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := net.FileConn(remote)
	remote.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	done := make(chan *conn)
	srv.startConn(local, func(c *conn) {
		// After newConn's SetWriteBuffer: the kernel's minimum send buffer, a few KiB.
		if err := c.nc.(*net.UnixConn).SetWriteBuffer(1); err != nil {
			t.Error(err)
		}
		c.exp = srv.export(structured)
		c.transmit()
		done <- c
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
	c := <-done
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	return c.flushedReplies, c.partialWrites
}
