package pdu

import (
	"bytes"
	"testing"
)

// FuzzDecode feeds arbitrary bytes to Decode with every digest setting: it must never panic, and
// whatever it accepts must be internally consistent (lengths within the input, a valid header).
func FuzzDecode(f *testing.F) {
	th := TargetHeader{StatSN: 1, ExpCmdSN: 2, MaxCmdSN: 9}
	var b BHS
	EncodeDataIn(&b, FlagFinal|FlagStatus, 0, 3, 1, ReservedTag, th, 0, 0, 0)
	f.Add(targetPDU(f, &b, []byte{1, 2, 3}, false, false), false, false)
	f.Add(targetPDU(f, &b, []byte{1, 2, 3}, true, true), true, true)
	EncodeR2T(&b, 1, 2, 3, th, 0, 0, 4096)
	f.Add(targetPDU(f, &b, nil, true, false), true, false)
	EncodeSCSIResponse(&b, FlagUnderflow, 0, 2, 6, 5, th, 0, 100)
	f.Add(targetPDU(f, &b, []byte{0, 4, 0x70, 0, 5, 0}, false, false), false, false)
	EncodeReject(&b, 4, th)
	f.Add(targetPDU(f, &b, make([]byte, 48), false, false), false, false)
	EncodeLoginResponse(&b, true, false, 0, 1, 9, 0x800000000001, 0, 0, th, 0, 0)
	f.Add(targetPDU(f, &b, []byte("Auth=None"), false, false), false, false)
	EncodeAsyncMessage(&b, 0, 0, th, 1, 0, 0, 0, 5)
	b[4] = 2 // with an AHS
	withAHS := append(append([]byte(nil), b[:]...), AppendBidiReadLength(nil, 7)...)
	f.Add(withAHS, false, false)
	f.Fuzz(func(t *testing.T, data []byte, hd, dd bool) {
		p, n, err := Decode(data, hd, dd, 1<<16)
		if err != nil {
			return
		}
		if n > len(data) || n < BHSLen || len(p.Data) != p.BHS.DataSegmentLength() || len(p.AHS) != p.BHS.TotalAHSLength() {
			t.Fatalf("inconsistent decode: n=%d len=%d", n, len(data))
		}
		if !bytes.Equal(p.BHS[:], data[:BHSLen]) {
			t.Fatal("BHS differs from the input")
		}
		if err := p.BHS.Validate(1 << 16); err != nil {
			t.Fatalf("accepted an invalid header: %v", err)
		}
		_, _ = SenseData(p.Data)
	})
}

// FuzzNextAHS walks arbitrary AHS areas.
func FuzzNextAHS(f *testing.F) {
	f.Add(appendExtendedCDB(nil, make([]byte, 20)))
	f.Add(AppendBidiReadLength(nil, 1))
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, ahs []byte) {
		for i := 0; len(ahs) > 0 && i < 1000; i++ {
			a, rest, err := NextAHS(ahs)
			if err != nil {
				return
			}
			if len(rest) >= len(ahs) {
				t.Fatal("NextAHS made no progress")
			}
			_ = a.BidiReadLength()
			ahs = rest
		}
	})
}
