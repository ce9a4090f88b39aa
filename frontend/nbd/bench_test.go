package nbd

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"

	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/pool"
)

// benchConn serves a memory device on one end of a socketpair (transmission phase, as the kernel
// uses it) and returns the client's end.
func benchConn(b testing.TB, structured bool, devSize int64) (net.Conn, *Server) {
	b.Helper()
	dev, err := memdev.New(devSize, memdev.Options{})
	if err != nil {
		b.Fatal(err)
	}
	// Touch every chunk so the memory device's first-write allocations stay out of the numbers.
	chunk := make([]byte, 1<<20)
	for off := int64(0); off < dev.Size(); off += 1 << 20 {
		if err := dev.WriteAt(context.Background(), chunk, off, 0); err != nil {
			b.Fatal(err)
		}
	}
	p, err := pool.New(pool.Config{MaxBytes: 256 << 20})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	srv, err := NewServer(dev, Options{Pool: p, Counters: benchCounters})
	if err != nil {
		b.Fatal(err)
	}
	local, client := connectedPair(b)
	done := make(chan struct{})
	go func() {
		if structured {
			srv.startConn(local, func(c *conn) { c.exp = srv.export(true); c.transmit(); close(done) })
		} else {
			srv.serveTransmission(local, func(*conn) {})
			close(done)
		}
	}()
	b.Cleanup(func() {
		client.Close()
		<-done
	})
	return client, srv
}

// benchRequests pipelines b.N requests of one kind through one connection: a sender goroutine
// writes requests while the benchmark goroutine reads the replies, so the server sees a deep
// queue. The client side allocates nothing either, so allocs/op is the server's request/reply
// path.
func benchRequests(b *testing.B, cmd uint16, size int, structured bool) {
	client, _ := benchConn(b, structured, 256<<20)
	const window = 64
	credits := make(chan struct{}, window)
	for range window {
		credits <- struct{}{}
	}
	reqBuf := make([]byte, requestHeaderLen+size)
	if cmd != cmdWrite {
		reqBuf = reqBuf[:requestHeaderLen]
	}
	replyLen := simpleReplyLen
	if cmd == cmdRead {
		replyLen += size
		if structured {
			replyLen = structuredHdrLen + 8 + size
		}
	}
	reply := make([]byte, replyLen)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	sendErr := make(chan error, 1)
	go func() {
		for i := range b.N {
			<-credits
			off := uint64(i%4096) * uint64(size) % (255 << 20)
			putRequest(reqBuf, header{Type: cmd, Handle: uint64(i), Offset: off - off%4096, Length: uint32(size)})
			if _, err := client.Write(reqBuf); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- nil
	}()
	for range b.N {
		if _, err := io.ReadFull(client, reply); err != nil {
			b.Fatal(err)
		}
		if m := binary.BigEndian.Uint32(reply); m != magicSimple && m != magicStructured {
			b.Fatalf("reply magic %#x", m)
		}
		if m := binary.BigEndian.Uint32(reply); m == magicSimple && binary.BigEndian.Uint32(reply[4:]) != 0 {
			b.Fatalf("errno %d", binary.BigEndian.Uint32(reply[4:]))
		}
		credits <- struct{}{}
	}
	if err := <-sendErr; err != nil {
		b.Fatal(err)
	}
}

func BenchmarkWrite4K(b *testing.B)            { benchRequests(b, cmdWrite, 4096, false) }
func BenchmarkRead4K(b *testing.B)             { benchRequests(b, cmdRead, 4096, false) }
func BenchmarkRead4KStructured(b *testing.B)   { benchRequests(b, cmdRead, 4096, true) }
func BenchmarkWrite128K(b *testing.B)          { benchRequests(b, cmdWrite, 128<<10, false) }
func BenchmarkRead128KStructured(b *testing.B) { benchRequests(b, cmdRead, 128<<10, true) }
func BenchmarkFlush(b *testing.B)              { benchRequests(b, cmdFlush, 0, false) }

// TestRequestPathAllocatesNothing asserts the benchmarks' claim in the unit tier: after warm-up,
// a 4 KiB write or read round trip over a socket allocates nothing (runtime-wide malloc count, so
// the server's goroutines are included).
func TestRequestPathAllocatesNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		cmd  uint16
		st   bool
	}{{"write", cmdWrite, false}, {"read", cmdRead, false}, {"read-structured", cmdRead, true}, {"flush", cmdFlush, false}} {
		client, _ := benchConn(t, tc.st, 8<<20)
		req := make([]byte, requestHeaderLen+4096)
		if tc.cmd != cmdWrite {
			req = req[:requestHeaderLen]
		}
		reply := make([]byte, simpleReplyLen)
		if tc.cmd == cmdRead {
			reply = make([]byte, simpleReplyLen+4096)
			if tc.st {
				reply = make([]byte, structuredHdrLen+8+4096)
			}
		}
		length := uint32(4096)
		if tc.cmd == cmdFlush {
			length = 0
		}
		if a := roundTripAllocs(t, client, req, reply, tc.cmd, length); a > 0.01 {
			t.Errorf("%s: %.3f allocs per request, want 0", tc.name, a)
		}
	}
}

// roundTripAllocs sends req (a request header, with its payload for a write) as cmd of length
// bytes and reads reply back, 500 times to warm up, then reports the allocations per round trip
// over 2000 more (runtime-wide: the server's goroutines are counted too).
func roundTripAllocs(t *testing.T, nc net.Conn, req, reply []byte, cmd uint16, length uint32) float64 {
	t.Helper()
	i := uint64(0)
	roundTrip := func() {
		i++
		putRequest(req, header{Type: cmd, Handle: i, Offset: (i % 1024) * 4096, Length: length})
		if _, err := nc.Write(req); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(nc, reply); err != nil {
			t.Fatal(err)
		}
	}
	for range 500 {
		roundTrip()
	}
	return testing.AllocsPerRun(2000, roundTrip)
}
