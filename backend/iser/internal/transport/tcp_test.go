package transport

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/internal/fdtest"
)

// loopPair returns two TCPConns over a loopback TCP connection (real sockets, so writev is used).
func loopPair(t testing.TB) (*TCPConn, *TCPConn) {
	a, b := fdtest.TCPPair(t)
	ca, cb := NewTCPConn(a), NewTCPConn(b)
	t.Cleanup(func() { ca.Close(); cb.Close() })
	return ca, cb
}

func start(t testing.TB, c *TCPConn, digests bool) {
	p := login.Defaults()
	p.HeaderDigest, p.DataDigest = digests, digests
	p.MaxRecvDataSegmentLength = 1 << 20
	if err := c.Start(&p); err != nil {
		t.Fatal(err)
	}
}

func TestTCPRoundTrip(t *testing.T) {
	for _, digests := range []bool{false, true} {
		a, b := loopPair(t)
		start(t, a, digests)
		start(t, b, digests)
		// The "target" side writes target PDUs through the same framing code.
		for _, n := range []int{0, 1, 3, 4, 4097, 65536} {
			data := bytes.Repeat([]byte{byte(n)}, n)
			var h pdu.BHS
			pdu.EncodeDataIn(&h, pdu.FlagFinal|pdu.FlagStatus, 0, n, 1, pdu.ReservedTag, pdu.TargetHeader{}, 0, 0, 0)
			errc := make(chan error, 1)
			go func() { errc <- b.WritePDU(&h, nil, data) }()
			var got pdu.BHS
			if _, err := a.ReadHeader(&got); err != nil {
				t.Fatalf("digests=%v n=%d: %v", digests, n, err)
			}
			if got != h {
				t.Fatalf("header differs")
			}
			dst := make([]byte, got.DataSegmentLength())
			if n%2 == 0 {
				if err := a.ReadData(dst); err != nil || !bytes.Equal(dst, data) {
					t.Fatalf("ReadData n=%d: %v", n, err)
				}
			} else if err := a.DiscardData(); err != nil {
				t.Fatalf("DiscardData n=%d: %v", n, err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestTCPDigestMismatch(t *testing.T) {
	a, b := loopPair(t)
	start(t, a, true)
	// b writes without digests but lies: raw bytes with a wrong data digest.
	var h pdu.BHS
	pdu.EncodeDataIn(&h, pdu.FlagFinal|pdu.FlagStatus, 0, 4, 1, pdu.ReservedTag, pdu.TargetHeader{}, 0, 0, 0)
	raw := append([]byte(nil), h[:]...)
	var d [4]byte
	pdu.PutDigest(d[:], pdu.HeaderDigest(&h, nil))
	raw = append(raw, d[:]...)
	raw = append(raw, 1, 2, 3, 4, 9, 9, 9, 9)
	go b.nc.Write(raw)
	var got pdu.BHS
	if _, err := a.ReadHeader(&got); err != nil {
		t.Fatal(err)
	}
	var de *pdu.DigestError
	if err := a.ReadData(make([]byte, 4)); !errors.As(err, &de) || de.What != "data" {
		t.Fatalf("ReadData with a bad digest: %v", err)
	}
}

func TestTCPMisuse(t *testing.T) {
	a, b := loopPair(t)
	var h pdu.BHS
	pdu.EncodeNOPIn(&h, 8, 0, 1, pdu.ReservedTag, pdu.TargetHeader{})
	go b.WritePDU(&h, nil, make([]byte, 8))
	var got pdu.BHS
	if _, err := a.ReadHeader(&got); err != nil {
		t.Fatal(err)
	}
	if err := a.ReadData(make([]byte, 4)); err == nil {
		t.Fatal("ReadData with the wrong length accepted")
	}
	if _, err := a.ReadHeader(&got); err == nil {
		t.Fatal("ReadHeader before the data was consumed accepted")
	}
	if err := a.WritePDU(&h, nil, make([]byte, 3)); err == nil {
		t.Fatal("WritePDU with a length mismatch accepted")
	}
	b.Close()
	if err := a.DiscardData(); err == nil || !errors.Is(err, io.EOF) {
		t.Logf("discard after close: %v", err)
	}
}

// TestTCPZeroAlloc: steady-state send and receive of a PDU allocate nothing.
func TestTCPZeroAlloc(t *testing.T) {
	a, b := loopPair(t)
	start(t, a, true)
	start(t, b, true)
	data := make([]byte, 16384)
	dst := make([]byte, 16384)
	var h, got pdu.BHS
	pdu.EncodeDataIn(&h, 0, 0, len(data), 1, pdu.ReservedTag, pdu.TargetHeader{}, 0, 0, 0)
	task := Task{ITT: 1, Dir: scsi.DirWrite, Buf: data, Immediate: 0}
	var cmd pdu.BHS
	(&pdu.SCSICommand{Write: true, ITT: 1, CDB: make([]byte, 16)}).Encode(&cmd)
	drain := make([]byte, pdu.BHSLen+pdu.DigestLen)
	allocs := testing.AllocsPerRun(200, func() {
		if err := b.WritePDU(&h, nil, data); err != nil {
			t.Fatal(err)
		}
		if _, err := a.ReadHeader(&got); err != nil {
			t.Fatal(err)
		}
		if err := a.ReadData(dst); err != nil {
			t.Fatal(err)
		}
		if err := a.WriteCommand(&cmd, nil, &task); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(b.nc, drain); err != nil { // drain the command a sent, raw
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per PDU round trip", allocs)
	}
}

func BenchmarkTCPWriteRead16K(b *testing.B) {
	x, y := loopPair(b)
	data := make([]byte, 16384)
	dst := make([]byte, 16384)
	var h, got pdu.BHS
	pdu.EncodeDataIn(&h, 0, 0, len(data), 1, pdu.ReservedTag, pdu.TargetHeader{}, 0, 0, 0)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < b.N; i++ {
			if _, err := x.ReadHeader(&got); err != nil {
				return
			}
			if err := x.ReadData(dst); err != nil {
				return
			}
		}
	}()
	for i := 0; i < b.N; i++ {
		if err := y.WritePDU(&h, nil, data); err != nil {
			b.Fatal(err)
		}
	}
	<-done
}

func TestRegistry(t *testing.T) {
	d, err := Lookup("iscsi")
	if err != nil || d.DefaultPort() != 3260 {
		t.Fatalf("iscsi transport: %v", err)
	}
	if _, err := Lookup("nope"); err == nil {
		t.Fatal("unknown scheme found")
	}
	for in, want := range map[string]string{
		"host": "host:3260", "host:99": "host:99", "[::1]": "[::1]:3260", "::1": "[::1]:3260", "[::1]:5": "[::1]:5",
	} {
		if got := JoinHostPort(in, 3260); got != want {
			t.Errorf("JoinHostPort(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestTCPWritePDUs: a batch (commands with immediate data, Data-Out, an AHS-carrying PDU) arrives
// intact and in order, with and without digests, also when larger than one writev batch.
func TestTCPWritePDUs(t *testing.T) {
	for _, digests := range []bool{false, true} {
		a, b := loopPair(t)
		start(t, a, digests)
		start(t, b, digests)
		var batch []OutPDU
		var want [][]byte
		for i := 0; i < 150; i++ {
			h := new(pdu.BHS)
			data := bytes.Repeat([]byte{byte(i)}, i*13)
			switch i % 3 {
			case 0:
				(&pdu.SCSICommand{Write: true, ITT: uint32(i), DataSegmentLength: len(data), CDB: make([]byte, 16)}).Encode(h)
				task := &Task{ITT: uint32(i), Dir: scsi.DirWrite, Buf: append(data, 1, 2, 3), Immediate: len(data)}
				batch = append(batch, OutPDU{BHS: h, Task: task})
			case 1:
				(&pdu.DataOut{ITT: uint32(i), DataSegmentLength: len(data)}).Encode(h)
				batch = append(batch, OutPDU{BHS: h, Data: data})
			default:
				(&pdu.SCSICommand{Read: true, ITT: uint32(i), AHSLength: 8, CDB: make([]byte, 16)}).Encode(h)
				batch = append(batch, OutPDU{BHS: h, AHS: pdu.AppendBidiReadLength(nil, 5)})
				data = nil
			}
			want = append(want, data)
		}
		errc := make(chan error, 1)
		go func() { errc <- a.WritePDUs(batch) }()
		// Read them back raw on b (b parses initiator PDUs here only for the test).
		for i := range batch {
			var h pdu.BHS
			if _, err := io.ReadFull(b.br, h[:]); err != nil {
				t.Fatal(err)
			}
			if h != *batch[i].BHS {
				t.Fatalf("PDU %d header differs", i)
			}
			ahs := make([]byte, h.TotalAHSLength())
			io.ReadFull(b.br, ahs)
			if digests {
				var d [4]byte
				io.ReadFull(b.br, d[:])
				if pdu.GetDigest(d[:]) != pdu.HeaderDigest(&h, ahs) {
					t.Fatalf("PDU %d header digest", i)
				}
			}
			n := h.DataSegmentLength()
			if n != len(want[i]) {
				t.Fatalf("PDU %d: %d data bytes, want %d", i, n, len(want[i]))
			}
			if n > 0 {
				got := make([]byte, pdu.Padded(n))
				io.ReadFull(b.br, got)
				if !bytes.Equal(got[:n], want[i]) {
					t.Fatalf("PDU %d data differs", i)
				}
				if digests {
					var d [4]byte
					io.ReadFull(b.br, d[:])
					if pdu.GetDigest(d[:]) != pdu.DataDigest(want[i]) {
						t.Fatalf("PDU %d data digest", i)
					}
				}
			}
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

// TestTCPBatchZeroAlloc: a batched write of many PDUs (more iovecs than unix.Writev keeps on the
// stack) allocates nothing in steady state.
func TestTCPBatchZeroAlloc(t *testing.T) {
	a, b := loopPair(t)
	start(t, a, false)
	start(t, b, false)
	const n = 32
	batch := make([]OutPDU, n)
	data := make([]byte, 4096)
	for i := range batch {
		h := new(pdu.BHS)
		(&pdu.DataOut{ITT: uint32(i), DataSegmentLength: len(data)}).Encode(h)
		batch[i] = OutPDU{BHS: h, Data: data}
	}
	total := n * (pdu.BHSLen + len(data))
	sink := make([]byte, total)
	allocs := testing.AllocsPerRun(50, func() {
		if err := a.WritePDUs(batch); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(b.nc, sink); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per batch of %d PDUs", allocs, n)
	}
}

// TestReadDataDirect streams Data-In PDUs of many sizes, written back to back, through ReadData:
// the bytes arrive intact whether they came out of bufio, straight from the conn or both; a
// segment with at least directReadMin beyond what bufio held is read straight from the conn, and
// neither its padding and digest nor the header after it are read with read-ahead into the next
// segment.
func TestReadDataDirect(t *testing.T) {
	segs := []int{100, 4097, 512 << 10, 3, directReadMin, 262144, 1, 131072 + 5, 1 << 20, 48}
	pairs := []struct {
		name string
		pair func(t *testing.T) (*TCPConn, *TCPConn)
	}{
		{"tcp", func(t *testing.T) (*TCPConn, *TCPConn) { return loopPair(t) }},
		{"net.Pipe", func(t *testing.T) (*TCPConn, *TCPConn) {
			x, y := net.Pipe()
			a, b := NewTCPConn(x), NewTCPConn(y)
			t.Cleanup(func() { a.Close(); b.Close() })
			return a, b
		}},
	}
	for _, p := range pairs {
		for _, digests := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/digests=%v", p.name, digests), func(t *testing.T) {
				a, b := p.pair(t)
				start(t, a, digests)
				start(t, b, digests)
				errc := make(chan error, 1)
				go func() {
					for i, n := range append(segs, 8) {
						h := dataInPDU(n)
						if err := b.WritePDU(&h, nil, pattern(n, i)); err != nil {
							errc <- err
							return
						}
					}
					errc <- nil
				}()
				direct := 0
				for i, n := range append(segs, 8) {
					afterDirect := a.exact && a.br.Buffered() == 0
					var h pdu.BHS
					if _, err := a.ReadHeader(&h); err != nil {
						t.Fatalf("segment %d: %v", i, err)
					}
					if afterDirect && a.br.Buffered() != 0 {
						t.Fatalf("segment %d: bufio read %d bytes ahead of a header that followed a directly read segment", i, a.br.Buffered())
					}
					held := a.br.Buffered()
					dst := make([]byte, h.DataSegmentLength())
					if err := a.ReadData(dst); err != nil {
						t.Fatalf("segment %d (%d bytes): %v", i, n, err)
					}
					if !bytes.Equal(dst, pattern(n, i)) {
						t.Fatalf("segment %d (%d bytes): data differs", i, n)
					}
					if want := n-min(held, n) >= directReadMin; a.exact != want {
						t.Fatalf("segment %d (%d bytes, %d in bufio): read directly %v, want %v", i, n, held, a.exact, want)
					}
					if a.exact {
						direct++
						// Nothing after the segment was read ahead, its padding and digest
						// included: the next header comes straight from the conn.
						if b := a.br.Buffered(); b != 0 {
							t.Fatalf("segment %d (%d bytes) was read directly, but bufio then read %d bytes ahead", i, n, b)
						}
					}
				}
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
				if direct == 0 {
					t.Fatal("no segment was read directly")
				}
			})
		}
	}
}
