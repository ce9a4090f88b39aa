package transport

import (
	"bytes"
	"io"
	"net"
	"testing"

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

// TestTCPLentSendAfterClose: a lent send on a closed connection fails (the pipe is closed with
// the socket), and Close and Abort may run more than once.
func TestTCPLentSendAfterClose(t *testing.T) {
	a, _ := fdtest.TCPPair(t)
	c := NewTCPConn(a)
	var lent bool
	buf := make([]byte, LendMin)
	if err := c.WritePDUs([]OutPDU{{BHS: dataOutPDU(len(buf)), Data: buf, Lent: &lent}}); err != nil {
		t.Fatal(err)
	}
	c.Abort()
	c.Close()
	if err := c.WritePDUs([]OutPDU{{BHS: dataOutPDU(len(buf)), Data: buf, Lent: &lent}}); err == nil {
		t.Fatal("a lent send on a closed connection succeeded")
	}
}
