package transport

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/internal/fdtest"
)

// dataOutPDU is a Data-Out header for a segment of n bytes.
func dataOutPDU(n int) *pdu.BHS {
	var h pdu.BHS
	d := pdu.DataOut{ITT: 7, TTT: 9, Final: true, DataSegmentLength: n}
	d.Encode(&h)
	return &h
}

// readPDUs reads n PDUs (header and data, no digests) from r.
func readPDUs(t *testing.T, r io.Reader, n int) [][]byte {
	t.Helper()
	var segs [][]byte
	for range n {
		var h pdu.BHS
		if _, err := io.ReadFull(r, h[:]); err != nil {
			t.Fatal(err)
		}
		seg := make([]byte, pdu.Padded(h.DataSegmentLength()))
		if _, err := io.ReadFull(r, seg); err != nil {
			t.Fatal(err)
		}
		segs = append(segs, seg[:h.DataSegmentLength()])
	}
	return segs
}

// TestTCPLentSend: a segment offered for lending (OutPDU.Lent) and at least LendMin long goes
// out by reference, so the peer reads the pages as they are when it reads them, not as they
// were when the write returned; that is what obliges the session to hold lent buffers. A
// segment not offered, or too small, is copied: changing the buffer after the write returns
// changes nothing the peer reads. Every PDU arrives whole and in order either way.
func TestTCPLentSend(t *testing.T) {
	for _, tc := range []struct {
		name     string
		offer    bool
		size     int
		wantLent bool
	}{
		{"lent", true, 256 << 10, true},
		{"not offered", false, 256 << 10, false},
		{"too small", true, LendMin - 4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := fdtest.TCPPair(t)
			// Room for the whole batch in the socket queues, so the writes return before the
			// peer reads anything.
			a.(*net.TCPConn).SetWriteBuffer(8 << 20) //nolint:errcheck // the kernel may cap it; the test needs ~1 MiB
			b.(*net.TCPConn).SetReadBuffer(8 << 20)  //nolint:errcheck
			c := NewTCPConn(a)
			small := bytes.Repeat([]byte{0x5a}, 512)
			buf := make([]byte, tc.size)
			for i := range buf {
				buf[i] = byte(i % 251)
			}
			want := bytes.Clone(buf)
			var lent bool
			var offer *bool
			if tc.offer {
				offer = &lent
			}
			batch := []OutPDU{
				{BHS: dataOutPDU(len(small)), Data: small},
				{BHS: dataOutPDU(len(buf)), Data: buf, Lent: offer},
				{BHS: dataOutPDU(len(small)), Data: small},
			}
			if err := c.WritePDUs(batch); err != nil {
				t.Fatal(err)
			}
			if lent != tc.wantLent {
				t.Fatalf("lent = %v, want %v", lent, tc.wantLent)
			}
			for i := range buf {
				buf[i] = ^buf[i] // the caller reuses its buffer before the peer has read
			}
			segs := readPDUs(t, b, len(batch))
			if !bytes.Equal(segs[0], small) || !bytes.Equal(segs[2], small) {
				t.Fatal("the copied PDUs around the large one arrived damaged")
			}
			switch {
			case tc.wantLent && !bytes.Equal(segs[1], buf):
				t.Fatal("the lent segment was copied: the peer read the old contents")
			case !tc.wantLent && !bytes.Equal(segs[1], want):
				t.Fatal("a copied segment changed after the write returned")
			}
		})
	}
}

// TestTCPLentSendAbortedWhileBlocked: a lent send blocked in the splice (the peer reads nothing)
// returns when the connection is aborted, the pipe is closed after it (no descriptor is closed
// under the system call), and a later lent send fails instead of reusing the pipe.
func TestTCPLentSendAbortedWhileBlocked(t *testing.T) {
	a, b := fdtest.TCPPair(t)
	a.(*net.TCPConn).SetWriteBuffer(64 << 10) //nolint:errcheck // smaller queues fill sooner; not required
	b.(*net.TCPConn).SetReadBuffer(64 << 10)  //nolint:errcheck
	c := NewTCPConn(a)
	var lent bool
	buf := make([]byte, 8<<20) // a data segment's length has 24 bits
	written := make(chan error, 1)
	go func() { written <- c.WritePDUs([]OutPDU{{BHS: dataOutPDU(len(buf)), Data: buf, Lent: &lent}}) }()
	waitQueued(t, a.(*net.TCPConn))
	c.Abort()
	select {
	case err := <-written:
		if err == nil {
			t.Fatal("an 8 MiB lent send completed although the peer read nothing")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the blocked lent send did not return after Abort")
	}
	if !lent {
		t.Fatal("the segment was not lent")
	}
	c.lend.mu.Lock()
	r, w := c.lend.r, c.lend.w
	c.lend.mu.Unlock()
	if r != -1 || w != -1 {
		t.Fatalf("pipe descriptors %d, %d still open after Abort", r, w)
	}
	if err := c.WritePDUs([]OutPDU{{BHS: dataOutPDU(LendMin), Data: buf[:LendMin], Lent: &lent}}); err == nil {
		t.Fatal("a lent send after Abort succeeded")
	}
}
