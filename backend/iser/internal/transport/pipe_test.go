package transport

import (
	"bytes"
	"errors"
	"testing"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/internal/fdtest"
)

func pattern(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + seed*13 + i>>8)
	}
	return b
}

func dataInPDU(n int) pdu.BHS {
	var h pdu.BHS
	pdu.EncodeDataIn(&h, pdu.FlagFinal, 0, n, 1, pdu.ReservedTag, pdu.TargetHeader{}, 0, 0, 0)
	return h
}

func TestReadDataToPipe(t *testing.T) {
	cases := []struct {
		name     string
		pipeSize int
		segs     []int
		// headerAlone: the target sends each data segment only after the reader has the header,
		// so bufio holds none of it and all of it is spliced from the socket.
		headerAlone bool
		full        bool // the pipe cannot take the first segment: ErrPipeFull
	}{
		{"small segment all in bufio", 1 << 20, []int{100}, false, false},
		{"padding", 1 << 20, []int{4097}, false, false},
		{"512 KiB partly in bufio", 1 << 20, []int{512 << 10}, false, false},
		{"several in a row", 1 << 20, []int{3, 65536, 262144, 1, 131072 + 5}, false, false},
		{"all spliced", 1 << 20, []int{262144, 65536 + 3}, true, false},
		{"pipe full on the buffered part", 4096, []int{65536, 100}, false, true},
		{"pipe full while splicing", 4096, []int{1 << 20, 100}, true, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := loopPair(t)
			start(t, a, false)
			start(t, b, false)
			if !a.CanReadToPipe() {
				t.Fatal("a loopback TCP connection without digests cannot read to a pipe")
			}
			pr, pw := fdtest.Pipe(t, tc.pipeSize)
			gotHeader := make(chan struct{})
			errc := make(chan error, 1)
			go func() {
				for i, n := range tc.segs {
					h := dataInPDU(n)
					data := pattern(n, i)
					if tc.headerAlone {
						if _, err := b.nc.Write(h[:]); err != nil {
							errc <- err
							return
						}
						<-gotHeader
						raw := append(data, make([]byte, pdu.PadLen(n))...)
						if _, err := b.nc.Write(raw); err != nil {
							errc <- err
							return
						}
						continue
					}
					if err := b.WritePDU(&h, nil, data); err != nil {
						errc <- err
						return
					}
				}
				// A trailer PDU proves the stream is still in sync.
				h := dataInPDU(8)
				if tc.headerAlone {
					if _, err := b.nc.Write(append(h[:], []byte("in sync!")...)); err != nil {
						errc <- err
						return
					}
					<-gotHeader
				} else if err := b.WritePDU(&h, nil, []byte("in sync!")); err != nil {
					errc <- err
					return
				}
				errc <- nil
			}()
			for i, n := range tc.segs {
				var h pdu.BHS
				ahead := a.br.Buffered()
				if _, err := a.ReadHeader(&h); err != nil {
					t.Fatal(err)
				}
				if i > 0 && ahead == 0 && a.br.Buffered() != 0 {
					// After a spliced segment that left bufio empty the header is read
					// alone, so that none of the next segment is read ahead (and copied
					// instead of spliced).
					t.Fatalf("segment %d: bufio read %d bytes ahead of a header that followed a spliced segment", i, a.br.Buffered())
				}
				if tc.headerAlone {
					gotHeader <- struct{}{}
				}
				err := a.ReadDataToPipe(pw)
				got := fdtest.Drain(t, pr)
				want := pattern(n, i)
				if i == 0 && tc.full {
					if !errors.Is(err, ErrPipeFull) {
						t.Fatalf("segment %d (%d bytes) into a %d-byte pipe: %v, want ErrPipeFull", i, n, tc.pipeSize, err)
					}
					if len(got) > tc.pipeSize || !bytes.Equal(got, want[:len(got)]) {
						t.Fatalf("pipe holds %d bytes that are not the segment's start", len(got))
					}
					continue
				}
				if err != nil {
					t.Fatalf("segment %d (%d bytes): %v", i, n, err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("segment %d: pipe holds %d bytes, want the %d sent", i, len(got), n)
				}
			}
			var h pdu.BHS
			if _, err := a.ReadHeader(&h); err != nil {
				t.Fatalf("after the segments: %v", err)
			}
			if tc.headerAlone {
				gotHeader <- struct{}{}
			}
			tail := make([]byte, 8)
			if err := a.ReadData(tail); err != nil || string(tail) != "in sync!" {
				t.Fatalf("trailer PDU: %q %v", tail, err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestCanReadToPipe(t *testing.T) {
	a, _ := loopPair(t)
	start(t, a, true)
	if a.CanReadToPipe() {
		t.Fatal("a connection with a data digest offers splicing (the CRC needs the bytes)")
	}
	_, pw := fdtest.Pipe(t, 1<<16)
	if err := a.ReadDataToPipe(pw); err == nil {
		t.Fatal("ReadDataToPipe with a data digest accepted")
	}
}
