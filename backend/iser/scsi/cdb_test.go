package scsi

import (
	"bytes"
	"strings"
	"testing"
)

func TestCDBBuilders(t *testing.T) {
	buf := make([]byte, 4096)
	sa := uint16(0x10)
	tests := []struct {
		name  string
		build func(c *Command)
		want  []byte
		dir   Direction
		data  int
	}{
		{"TEST UNIT READY", func(c *Command) { c.TestUnitReady() }, []byte{0, 0, 0, 0, 0, 0}, DirNone, 0},
		{"INQUIRY", func(c *Command) { c.Inquiry(buf[:96]) }, []byte{0x12, 0, 0, 0, 96, 0}, DirRead, 96},
		{"INQUIRY VPD B0", func(c *Command) { c.InquiryVPD(0xB0, buf[:64]) }, []byte{0x12, 1, 0xB0, 0, 64, 0}, DirRead, 64},
		{"INQUIRY VPD 83 long", func(c *Command) { c.InquiryVPD(0x83, buf[:1024]) }, []byte{0x12, 1, 0x83, 0x04, 0x00, 0}, DirRead, 1024},
		{"READ CAPACITY(10)", func(c *Command) { c.ReadCapacity10(buf[:8]) }, []byte{0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0}, DirRead, 8},
		{"READ CAPACITY(16)", func(c *Command) { c.ReadCapacity16(buf[:32]) },
			[]byte{0x9E, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0}, DirRead, 32},
		{"READ(10)", func(c *Command) { c.Read10(0x01020304, 8, false, buf[:4096]) },
			[]byte{0x28, 0, 1, 2, 3, 4, 0, 0, 8, 0}, DirRead, 4096},
		{"READ(10) FUA", func(c *Command) { c.Read10(7, 1, true, buf[:512]) },
			[]byte{0x28, 0x08, 0, 0, 0, 7, 0, 0, 1, 0}, DirRead, 512},
		{"READ(16)", func(c *Command) { c.Read16(0x0102030405060708, 0x11223344, false, buf[:8]) },
			[]byte{0x88, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x22, 0x33, 0x44, 0, 0}, DirRead, 8},
		{"WRITE(10) FUA", func(c *Command) { c.Write10(0xFFFFFFFF, 0xFFFF, true, buf[:512]) },
			[]byte{0x2A, 0x08, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0xFF, 0xFF, 0}, DirWrite, 512},
		{"WRITE(16)", func(c *Command) { c.Write16(1<<40, 2, false, buf[:1024]) },
			[]byte{0x8A, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0}, DirWrite, 1024},
		{"WRITE(16) FUA", func(c *Command) { c.Write16(3, 1, true, buf[:512]) },
			[]byte{0x8A, 0x08, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0}, DirWrite, 512},
		{"SYNCHRONIZE CACHE(10)", func(c *Command) { c.SynchronizeCache10(0x10, 0x20) },
			[]byte{0x35, 0, 0, 0, 0, 0x10, 0, 0, 0x20, 0}, DirNone, 0},
		{"SYNCHRONIZE CACHE(16)", func(c *Command) { c.SynchronizeCache16(0, 0) },
			[]byte{0x91, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, DirNone, 0},
		{"UNMAP", func(c *Command) { c.Unmap(buf[:24]) }, []byte{0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0}, DirWrite, 24},
		{"WRITE SAME(16) UNMAP", func(c *Command) { c.WriteSame16(5, 100, true, false, buf[:512]) },
			[]byte{0x93, 0x08, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 100, 0, 0}, DirWrite, 512},
		{"WRITE SAME(16) NDOB", func(c *Command) { c.WriteSame16(5, 100, false, true, buf[:512]) },
			[]byte{0x93, 0x01, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 100, 0, 0}, DirNone, 0},
		{"WRITE SAME(10)", func(c *Command) { c.WriteSame10(5, 100, false, buf[:512]) },
			[]byte{0x41, 0, 0, 0, 0, 5, 0, 0, 100, 0}, DirWrite, 512},
		{"MODE SENSE(10) caching", func(c *Command) { c.ModeSense10(0x08, 0, PCCurrent, true, buf[:255]) },
			[]byte{0x5A, 0x08, 0x08, 0, 0, 0, 0, 0, 255, 0}, DirRead, 255},
		{"MODE SENSE(10) all changeable", func(c *Command) { c.ModeSense10(0x3F, 0xFF, PCChangeable, false, buf[:300]) },
			[]byte{0x5A, 0, 0x7F, 0xFF, 0, 0, 0, 0x01, 0x2C, 0}, DirRead, 300},
		{"REPORT LUNS", func(c *Command) { c.ReportLUNs(0, buf[:1024]) },
			[]byte{0xA0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0}, DirRead, 1024},
		{"RSOC one", func(c *Command) { c.ReportSupportedOpcode(0x93, nil, buf[:20]) },
			[]byte{0xA3, 0x0C, 0x01, 0x93, 0, 0, 0, 0, 0, 20, 0, 0}, DirRead, 20},
		{"RSOC with SA", func(c *Command) { c.ReportSupportedOpcode(0x9E, &sa, buf[:20]) },
			[]byte{0xA3, 0x0C, 0x03, 0x9E, 0, 0x10, 0, 0, 0, 20, 0, 0}, DirRead, 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Command{LUN: 0x0001000000000000}
			// A stale CDB must not leak into the new command.
			c.CDB = [16]byte{0xEE, 0xEE, 0xEE, 0xEE, 0xEE, 0xEE, 0xEE, 0xEE, 0xEE, 0xEE, 0xEE, 0xEE, 0xEE, 0xEE, 0xEE, 0xEE}
			tt.build(c)
			if int(c.CDBLen) != len(tt.want) {
				t.Fatalf("CDBLen = %d, want %d", c.CDBLen, len(tt.want))
			}
			if !bytes.Equal(c.CDB[:c.CDBLen], tt.want) {
				t.Fatalf("CDB = % x\nwant  % x", c.CDB[:c.CDBLen], tt.want)
			}
			for _, b := range c.CDB[c.CDBLen:] {
				if b != 0 {
					t.Fatalf("bytes past CDBLen not cleared: % x", c.CDB)
				}
			}
			if c.Dir != tt.dir || len(c.Data) != tt.data {
				t.Fatalf("dir %d len %d, want %d %d", c.Dir, len(c.Data), tt.dir, tt.data)
			}
			if c.LUN != 0x0001000000000000 || c.Attr != AttrSimple {
				t.Fatalf("LUN %x attr %d", c.LUN, c.Attr)
			}
			if name := c.Name(); name == "" || strings.HasPrefix(name, "OPCODE") {
				t.Fatalf("unnamed command %q", name)
			}
		})
	}
}

func TestEncodeUnmap(t *testing.T) {
	dst := make([]byte, UnmapParamLen(2))
	for i := range dst {
		dst[i] = 0xAA
	}
	got := EncodeUnmap(dst, []UnmapDescriptor{{LBA: 0x0102, Blocks: 8}, {LBA: 1 << 33, Blocks: 0xFFFFFFFF}})
	want := []byte{
		0, 38, 0, 32, 0, 0, 0, 0,
		0, 0, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 8, 0, 0, 0, 0,
		0, 0, 0, 2, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0,
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("got  % x\nwant % x", got, want)
	}
}

func TestLUNEncoding(t *testing.T) {
	tests := []struct {
		lun  uint16
		want uint64
	}{
		{0, 0},
		{1, 0x0001000000000000},
		{255, 0x00FF000000000000},
		{256, 0x4100000000000000},
		{16383, 0x7FFF000000000000},
	}
	for _, tt := range tests {
		if got := EncodeLUN(tt.lun); got != tt.want {
			t.Errorf("EncodeLUN(%d) = %016x, want %016x", tt.lun, got, tt.want)
		}
		if got, ok := DecodeLUN(tt.want); !ok || got != tt.lun {
			t.Errorf("DecodeLUN(%016x) = %d %v", tt.want, got, ok)
		}
	}
	// Flat space addressing of a number below 256 is valid (SAM-5 §4.7.7) and names the same
	// number; EncodeLUN still writes the peripheral form, as Linux does.
	if got, ok := DecodeLUN(0x4030000000000000); !ok || got != 48 {
		t.Errorf("DecodeLUN(flat 48) = %d %v, want 48 true", got, ok)
	}
	for _, v := range []uint64{0x8000000000000000, 0x0001000100000000, 0x0101000000000000} {
		if _, ok := DecodeLUN(v); ok {
			t.Errorf("DecodeLUN(%016x) accepted a LUN it cannot represent", v)
		}
	}
}

func TestOpName(t *testing.T) {
	for cdb, want := range map[string]string{
		"\x9e\x10": "READ CAPACITY(16)",
		"\x9e\x11": "SERVICE ACTION IN(16)",
		"\x12\x01": "INQUIRY VPD",
		"\xa3\x0c": "REPORT SUPPORTED OPERATION CODES",
		"\xc1":     "OPCODE 0xc1",
		"":         "UNKNOWN",
	} {
		if got := OpName([]byte(cdb)); got != want {
			t.Errorf("OpName(% x) = %q, want %q", cdb, got, want)
		}
	}
}
