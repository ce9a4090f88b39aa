package pdu

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"
)

func TestSCSICommandEncode(t *testing.T) {
	cdb := []byte{0x8a, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 8, 0, 0}
	c := SCSICommand{Final: true, Write: true, Attr: 1, DataSegmentLength: 4096, LUN: 1 << 48, ITT: 0x10002,
		ExpectedDataTransferLength: 8192, CmdSN: 0xfffffffe, ExpStatSN: 7, CDB: cdb}
	var b BHS
	for i := range b {
		b[i] = 0xff // Encode must overwrite everything
	}
	c.Encode(&b)
	if b.Opcode() != OpSCSICommand || b.Immediate() || b.Flags() != FlagFinal|FlagWrite|1 ||
		b.DataSegmentLength() != 4096 || b.LUN() != 1<<48 || b.ITT() != 0x10002 ||
		b.ExpectedDataTransferLength() != 8192 || b.CmdSN() != 0xfffffffe || b.ExpStatSN() != 7 ||
		!bytes.Equal(b.CDB(), cdb) || b.TotalAHSLength() != 0 || b[2] != 0 || b[3] != 0 {
		t.Fatalf("encoded % x", b[:])
	}
}

func TestLoginRequestEncode(t *testing.T) {
	l := LoginRequest{Transit: true, CSG: StageOperational, NSG: StageFullFeature, DataSegmentLength: 100,
		ISID: 0x80123456789a, TSIH: 0, ITT: 0, CID: 3, CmdSN: 1, ExpStatSN: 0}
	var b BHS
	l.Encode(&b)
	csg, nsg := b.LoginStages()
	if b[0] != 0x43 || !b.Transit() || b.Continue() || csg != 1 || nsg != 3 || b.ISID() != 0x80123456789a ||
		binary.BigEndian.Uint16(b[20:22]) != 3 || b.DataSegmentLength() != 100 {
		t.Fatalf("encoded % x", b[:])
	}
	// NSG is zero unless T is set (§11.12.3).
	l.Transit = false
	l.Encode(&b)
	if _, nsg := b.LoginStages(); nsg != 0 {
		t.Fatalf("NSG %d without T", nsg)
	}
}

func TestOtherInitiatorEncoders(t *testing.T) {
	var b BHS
	(&DataOut{Final: true, DataSegmentLength: 512, LUN: 5, ITT: 9, TTT: 10, ExpStatSN: 11, DataSN: 12, BufferOffset: 13}).Encode(&b)
	if b.Opcode() != OpDataOut || !b.Final() || b.TTT() != 10 || b.DataSN() != 12 || b.BufferOffset() != 13 || b.ExpStatSN() != 11 {
		t.Fatalf("Data-Out % x", b[:])
	}
	(&NOPOut{Immediate: true, ITT: ReservedTag, TTT: 0x33, LUN: 2, CmdSN: 4, ExpStatSN: 5}).Encode(&b)
	if b.Opcode() != OpNOPOut || !b.Immediate() || b.ITT() != ReservedTag || b.TTT() != 0x33 || b.LUN() != 2 {
		t.Fatalf("NOP-Out % x", b[:])
	}
	(&TaskMgmtRequest{Immediate: true, Function: TMFAbortTask, ITT: 1, RefTaskTag: 2, RefCmdSN: 3}).Encode(&b)
	if b.Opcode() != OpTaskMgmtReq || b.Flags() != 0x81 || b.Word20() != 2 || b.Word32() != 3 {
		t.Fatalf("TMF % x", b[:])
	}
	(&LogoutRequest{Immediate: true, Reason: LogoutCloseSession, ITT: 7, CID: 1}).Encode(&b)
	if b.Opcode() != OpLogoutReq || b.Flags() != 0x80 || b.ITT() != 7 {
		t.Fatalf("Logout % x", b[:])
	}
	(&TextRequest{Final: true, ITT: 1, TTT: ReservedTag}).Encode(&b)
	if b.Opcode() != OpTextReq || !b.Final() || b.Continue() || b.TTT() != ReservedTag {
		t.Fatalf("Text % x", b[:])
	}
	(&SNACKRequest{Type: 1, ITT: 1, BegRun: 2, RunLength: 3}).Encode(&b)
	if b.Opcode() != OpSNACKReq || b.Flags() != 0x81 || b.BufferOffset() != 2 || b.ResidualCount() != 3 {
		t.Fatalf("SNACK % x", b[:])
	}
}

func TestEncodeAllocatesNothing(t *testing.T) {
	var b BHS
	c := SCSICommand{Read: true, ITT: 1, CDB: make([]byte, 16)}
	d := DataOut{ITT: 1, DataSegmentLength: 8}
	data := make([]byte, 8192)
	var in BHS
	EncodeDataIn(&in, FlagFinal|FlagStatus, 0, 8192, 1, ReservedTag, TargetHeader{}, 0, 0, 0)
	n := testing.AllocsPerRun(100, func() {
		c.Encode(&b)
		d.Encode(&b)
		_ = HeaderDigest(&b, nil)
		_ = DataDigest(data)
		if in.Validate(8192) != nil {
			panic("invalid")
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations per encode", n)
	}
}

// TestCRC32CKnownAnswer checks the iSCSI CRC32C against RFC 3720 Appendix B.4 vectors (32 bytes
// of zeros -> aa 36 91 8a on the wire) and Go's Castagnoli table.
func TestCRC32CKnownAnswer(t *testing.T) {
	zeros := make([]byte, 32)
	var wire [4]byte
	PutDigest(wire[:], CRC32C(0, zeros))
	if !bytes.Equal(wire[:], []byte{0xaa, 0x36, 0x91, 0x8a}) {
		t.Fatalf("CRC32C(32 zero bytes) on the wire = % x, want aa 36 91 8a", wire)
	}
	ones := bytes.Repeat([]byte{0xff}, 32)
	PutDigest(wire[:], CRC32C(0, ones))
	if !bytes.Equal(wire[:], []byte{0x43, 0xab, 0xa8, 0x62}) {
		t.Fatalf("CRC32C(32 0xff bytes) on the wire = % x, want 43 ab a8 62", wire)
	}
	if CRC32C(0, []byte("123456789")) != crc32.Checksum([]byte("123456789"), crc32.MakeTable(crc32.Castagnoli)) {
		t.Fatal("CRC32C disagrees with hash/crc32")
	}
	// The data digest covers the padding.
	if DataDigest([]byte{1, 2, 3}) != CRC32C(0, []byte{1, 2, 3, 0}) {
		t.Fatal("data digest does not cover the padding")
	}
}

func TestPadding(t *testing.T) {
	for n, want := range map[int]int{0: 0, 1: 3, 2: 2, 3: 1, 4: 0, 5: 3, 8192: 0, 8193: 3} {
		if PadLen(n) != want || Padded(n) != n+want {
			t.Errorf("PadLen(%d) = %d", n, PadLen(n))
		}
	}
}

func TestAHS(t *testing.T) {
	cdb := make([]byte, 32)
	for i := range cdb {
		cdb[i] = byte(i)
	}
	ahs := appendExtendedCDB(nil, cdb)
	ahs = AppendBidiReadLength(ahs, 4096)
	if len(ahs)%4 != 0 {
		t.Fatalf("AHS length %d", len(ahs))
	}
	a, rest, err := NextAHS(ahs)
	if err != nil || a.Type != AHSExtendedCDB || !bytes.Equal(a.Specific, cdb[16:]) {
		t.Fatalf("extended CDB AHS %+v %v", a, err)
	}
	a, rest, err = NextAHS(rest)
	if err != nil || a.Type != AHSBidiReadLength || a.BidiReadLength() != 4096 || len(rest) != 0 {
		t.Fatalf("bidi AHS %+v %v rest %d", a, err, len(rest))
	}
	for _, bad := range [][]byte{{0, 0, 1, 0}, {0, 9, 1, 0, 1, 2, 3, 4}, {0, 1}, {0, 4, 2, 0, 0, 0, 0, 0}} {
		if _, _, err := NextAHS(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("NextAHS(% x) = %v", bad, err)
		}
	}
}

func targetPDU(t testing.TB, b *BHS, data []byte, hd, dd bool) []byte {
	t.Helper()
	out := append([]byte(nil), b[:]...)
	if hd {
		out = binary.LittleEndian.AppendUint32(out, HeaderDigest(b, nil))
	}
	if len(data) > 0 {
		out = append(out, data...)
		out = append(out, ZeroPad(PadLen(len(data)))...)
		if dd {
			out = binary.LittleEndian.AppendUint32(out, DataDigest(data))
		}
	}
	return out
}

func TestDecode(t *testing.T) {
	var b BHS
	th := TargetHeader{StatSN: 1, ExpCmdSN: 2, MaxCmdSN: 3}
	EncodeDataIn(&b, FlagFinal|FlagStatus|FlagUnderflow, 0, 5, 0x10, ReservedTag, th, 0, 0, 7)
	wire := targetPDU(t, &b, []byte("hello"), true, true)
	p, n, err := Decode(wire, true, true, 8192)
	if err != nil || n != len(wire) || string(p.Data) != "hello" || p.BHS.ResidualCount() != 7 || p.BHS.StatSN() != 1 {
		t.Fatalf("Decode = %+v %d %v", p, n, err)
	}
	// Any flipped bit in the digest area fails the digest.
	bad := append([]byte(nil), wire...)
	bad[len(bad)-1] ^= 1
	var de *DigestError
	if _, _, err := Decode(bad, true, true, 8192); !errors.As(err, &de) || de.What != "data" || !errors.Is(err, ErrMalformed) {
		t.Fatalf("bad data digest: %v", err)
	}
	bad = append([]byte(nil), wire...)
	bad[49] ^= 1
	if _, _, err := Decode(bad, true, true, 8192); !errors.As(err, &de) || de.What != "header" {
		t.Fatalf("bad header digest: %v", err)
	}
	// Truncations at every length fail cleanly.
	for i := 0; i < len(wire); i++ {
		if _, _, err := Decode(wire[:i], true, true, 8192); err == nil {
			t.Fatalf("truncated to %d bytes decoded", i)
		}
	}
}

func TestValidate(t *testing.T) {
	th := TargetHeader{}
	var b BHS
	tests := []struct {
		name  string
		build func()
		ok    bool
	}{
		{"R2T ok", func() { EncodeR2T(&b, 0, 1, 2, th, 0, 0, 512) }, true},
		{"R2T without F", func() { EncodeR2T(&b, 0, 1, 2, th, 0, 0, 512); b[1] = 0 }, false},
		{"R2T zero length", func() { EncodeR2T(&b, 0, 1, 2, th, 0, 0, 0) }, false},
		{"R2T with data", func() { EncodeR2T(&b, 0, 1, 2, th, 0, 0, 512); b.SetDataSegmentLength(4) }, false},
		{"Data-In S without F", func() { EncodeDataIn(&b, FlagStatus, 0, 0, 1, 2, th, 0, 0, 0) }, false},
		{"Data-In O and U", func() { EncodeDataIn(&b, FlagFinal|FlagOverflow|FlagUnderflow, 0, 0, 1, 2, th, 0, 0, 0) }, false},
		{"Reject short", func() { EncodeReject(&b, 4, th); b.SetDataSegmentLength(10) }, false},
		{"Reject ok", func() { EncodeReject(&b, 4, th) }, true},
		{"Login stage 2", func() { EncodeLoginResponse(&b, true, false, 1, 2, 0, 0, 0, 0, th, 0, 0) }, false},
		{"Login T and C", func() { EncodeLoginResponse(&b, true, true, 1, 3, 0, 0, 0, 0, th, 0, 0) }, false},
		{"Text F and C", func() { EncodeTextResponse(&b, true, true, 0, 1, 2, th) }, false},
		{"too long", func() { EncodeNOPIn(&b, 9000, 0, 1, ReservedTag, th) }, false},
		{"initiator opcode", func() { (&NOPOut{}).Encode(&b) }, false},
		{"unknown opcode", func() { b = BHS{0x2f} }, false},
	}
	for _, tt := range tests {
		tt.build()
		if err := b.Validate(8192); (err == nil) != tt.ok {
			t.Errorf("%s: Validate = %v", tt.name, err)
		}
	}
}

func TestSenseData(t *testing.T) {
	if s, err := SenseData(nil); s != nil || err != nil {
		t.Fatal("empty segment")
	}
	if s, err := SenseData([]byte{0, 2, 0x70, 5, 9}); err != nil || !bytes.Equal(s, []byte{0x70, 5}) {
		t.Fatalf("sense %x %v", s, err)
	}
	for _, bad := range [][]byte{{0}, {0, 5, 1}} {
		if _, err := SenseData(bad); !errors.Is(err, ErrMalformed) {
			t.Fatalf("SenseData(% x) = %v", bad, err)
		}
	}
}

func TestOpcodeString(t *testing.T) {
	if OpR2T.String() != "R2T" || Opcode(0x2e).String() != "opcode 0x2e" {
		t.Fatal(OpR2T.String(), Opcode(0x2e).String())
	}
}
