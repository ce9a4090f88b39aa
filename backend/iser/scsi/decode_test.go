package scsi

import (
	"reflect"
	"testing"
)

func TestParseInquiry(t *testing.T) {
	std := make([]byte, 36)
	std[0] = 0x00
	std[2] = 0x06
	std[3] = 0x12
	std[4] = 31
	std[5] = 0x01
	std[7] = 0x02
	copy(std[8:], "LIO-ORG ")
	copy(std[16:], "disk0\x00\x00       ")
	copy(std[32:], "4.0\x07")
	tests := []struct {
		name    string
		in      []byte
		want    StandardInquiry
		wantErr bool
	}{
		{"full", std, StandardInquiry{Version: 6, HiSup: true, Format: 2, Protect: true, CmdQue: true,
			Vendor: "LIO-ORG", Product: "disk0", Revision: "4.0?"}, false},
		{"no LU", []byte{0x7F, 0, 0, 0, 0}, StandardInquiry{Qualifier: 3, DeviceType: 0x1F}, false},
		{"short vendor", append([]byte{0x0C, 0, 5, 2, 7, 0, 0, 0}, "ABC"...),
			StandardInquiry{DeviceType: 0x0C, Version: 5, Format: 2, Vendor: "ABC"}, false},
		{"additional length cuts", append([]byte{0, 0, 5, 2, 3, 0, 0, 0}, "ABCDEFGH"...),
			StandardInquiry{Version: 5, Format: 2}, false},
		{"too short", []byte{0, 0, 0, 0}, StandardInquiry{}, true},
	}
	for _, tt := range tests {
		got, err := ParseInquiry(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("%s: got %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
}

func vpdPage(page byte, payload []byte) []byte {
	return append([]byte{0, page, byte(len(payload) >> 8), byte(len(payload))}, payload...)
}

func TestVPDDecoders(t *testing.T) {
	if got, err := ParseSupportedVPDPages(vpdPage(0, []byte{0, 0x80, 0x83, 0xB0})); err != nil || !reflect.DeepEqual(got, []byte{0, 0x80, 0x83, 0xB0}) {
		t.Errorf("supported pages: %v %v", got, err)
	}
	if _, err := ParseSupportedVPDPages(vpdPage(0x80, nil)); err == nil {
		t.Error("wrong page accepted")
	}
	if got, err := ParseUnitSerial(vpdPage(0x80, []byte("beaf11  \x00"))); err != nil || got != "beaf11" {
		t.Errorf("serial: %q %v", got, err)
	}
	// Page length larger than what was transferred: use what is there.
	if got, err := ParseUnitSerial([]byte{0, 0x80, 0, 50, 'a', 'b'}); err != nil || got != "ab" {
		t.Errorf("truncated serial: %q %v", got, err)
	}

	naa := []byte{0x01, 0x03, 0x00, 0x10, 0x60, 0x01, 0x40, 0x50, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	t10 := append([]byte{0x02, 0x01, 0x00, 0x0C}, "IET     ab12"...)
	name := append([]byte{0x53, 0xA8, 0x00, 0x08}, "iqn.x:y\x00"...)
	trunc := []byte{0x01, 0x02, 0x00, 0x40, 1, 2}
	ds, err := ParseDeviceIdentification(vpdPage(0x83, append(append(append(naa, t10...), name...), trunc...)))
	if err != nil || len(ds) != 3 {
		t.Fatalf("designators: %+v %v", ds, err)
	}
	want := []string{"naa.600140500102030405060708090a0b0c", "t10.IET     ab12", "iqn.x:y"}
	for i, d := range ds {
		if d.String() != want[i] {
			t.Errorf("designator %d = %q, want %q", i, d.String(), want[i])
		}
	}
	if ds[2].Association != AssocTarget || !ds[2].PIV || ds[2].ProtocolID != 5 || ds[2].CodeSet != CodeSetUTF8 {
		t.Errorf("SCSI name designator fields: %+v", ds[2])
	}
	eui := Designator{Type: DesigEUI64, Value: []byte{1, 2, 3, 4, 5, 6, 7, 8}}
	if eui.String() != "eui.0102030405060708" {
		t.Errorf("eui: %s", eui)
	}
}

func TestParseBlockLimits(t *testing.T) {
	full := make([]byte, 0x3C)
	p := func(off int) []byte { return full[off-4:] }
	p(4)[0] = 1
	p(5)[0] = 1
	p(6)[0], p(6)[1] = 0, 8
	put32 := func(off int, v uint32) {
		b := p(off)
		b[0], b[1], b[2], b[3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
	}
	put32(8, 2048)
	put32(12, 256)
	put32(20, 0xFFFFFFFF)
	put32(24, 16)
	put32(28, 8)
	put32(32, 0x80000004)
	p(36)[7] = 0x40
	tests := []struct {
		name    string
		in      []byte
		want    BlockLimits
		wantErr bool
	}{
		{"full", vpdPage(0xB0, full), BlockLimits{Length: 0x3C, WSNZ: true, MaxCompareAndWrite: 1, OptimalTransferGranule: 8,
			MaxTransferLength: 2048, OptimalTransferLength: 256, MaxUnmapLBACount: 0xFFFFFFFF, MaxUnmapDescriptorCount: 16,
			OptimalUnmapGranularity: 8, UGAValid: true, UnmapGranularityAlignment: 4, MaxWriteSameLength: 0x40}, false},
		{"SBC-2 short page", vpdPage(0xB0, full[:12]), BlockLimits{Length: 12, WSNZ: true, MaxCompareAndWrite: 1,
			OptimalTransferGranule: 8, MaxTransferLength: 2048, OptimalTransferLength: 256}, false},
		{"field cut mid-way", vpdPage(0xB0, full[:6]), BlockLimits{Length: 6, WSNZ: true, MaxCompareAndWrite: 1, OptimalTransferGranule: 8}, false},
		{"wrong page", vpdPage(0xB2, full), BlockLimits{}, true},
		{"header only", []byte{0, 0xB0}, BlockLimits{}, true},
	}
	for _, tt := range tests {
		got, err := ParseBlockLimits(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("%s: got %+v, %v\nwant %+v", tt.name, got, err, tt.want)
		}
	}
}

func TestParseLogicalBlockProvisioning(t *testing.T) {
	tests := []struct {
		name    string
		in      []byte
		want    LogicalBlockProvisioning
		wantErr bool
	}{
		{"thin unmap ws lbprz", vpdPage(0xB2, []byte{0, 0xE4 | 0x02, 0x02, 0}), LogicalBlockProvisioning{LBPU: true, LBPWS: true,
			LBPWS10: true, LBPRZ: 1, ANCSup: true, ProvisioningType: 2}, false},
		{"lbprz 3 bits", vpdPage(0xB2, []byte{9, 0x1C}), LogicalBlockProvisioning{ThresholdExponent: 9, LBPRZ: 7}, false},
		{"too short", vpdPage(0xB2, []byte{0}), LogicalBlockProvisioning{}, true},
	}
	for _, tt := range tests {
		got, err := ParseLogicalBlockProvisioning(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("%s: got %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
}

func TestReadCapacity(t *testing.T) {
	rc16 := []byte{0, 0, 0, 0, 0, 0x0F, 0xFF, 0xFF, 0, 0, 0x10, 0, 0x05, 0x13, 0xC0, 0x07, 0, 0, 0, 0}
	c, err := ParseReadCapacity16(rc16)
	want := Capacity{LastLBA: 0xFFFFF, BlockSize: 4096, ProtType: 2, ProtEnabled: true, PIExponent: 1, PhysBlockExponent: 3,
		LBPME: true, LBPRZ: true, LowestAlignedLBA: 7, FromReadCapacity16: true}
	if err != nil || c != want {
		t.Fatalf("RC16: %+v %v\nwant %+v", c, err, want)
	}
	if c.Blocks() != 1<<20 || c.Bytes() != 4<<30 || c.PhysicalBlockSize() != 32768 || c.Validate() != nil {
		t.Fatalf("derived: %d %d %d %v", c.Blocks(), c.Bytes(), c.PhysicalBlockSize(), c.Validate())
	}
	if c, err := ParseReadCapacity16(rc16[:12]); err != nil || c.LastLBA != 0xFFFFF || c.LBPME {
		t.Fatalf("short RC16: %+v %v", c, err)
	}
	if _, err := ParseReadCapacity16(rc16[:11]); err == nil {
		t.Fatal("11-byte RC16 accepted")
	}
	c10, err := ParseReadCapacity10([]byte{0, 0, 0x07, 0xFF, 0, 0, 2, 0})
	if err != nil || c10.LastLBA != 2047 || c10.BlockSize != 512 || c10.Bytes() != 1<<20 {
		t.Fatalf("RC10: %+v %v", c10, err)
	}
	if _, err := ParseReadCapacity10([]byte{1, 2, 3}); err == nil {
		t.Fatal("short RC10 accepted")
	}
	for _, bad := range []Capacity{{BlockSize: 0}, {BlockSize: 520}, {BlockSize: 256}, {BlockSize: 1 << 17},
		{LastLBA: ^uint64(0), BlockSize: 512}, {LastLBA: 1 << 60, BlockSize: 4096}} {
		if bad.Validate() == nil {
			t.Errorf("Validate accepted %+v", bad)
		}
	}
}

func TestParseModeSense10(t *testing.T) {
	hdr := func(dsp byte, bdl int, pages ...byte) []byte {
		b := []byte{0, 0, 0, dsp, 0, 0, byte(bdl >> 8), byte(bdl)}
		b = append(b, make([]byte, bdl)...)
		b = append(b, pages...)
		n := len(b) - 2
		b[0], b[1] = byte(n>>8), byte(n)
		return b
	}
	caching := func(wce bool) []byte {
		p := make([]byte, 20)
		p[0], p[1] = 0x08, 18
		if wce {
			p[2] = 0x04
		}
		return p
	}
	control := []byte{0x0A, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	subpage := []byte{0x4A, 0x01, 0, 4, 0xFF, 0xFF, 0xFF, 0xFF}
	tests := []struct {
		name    string
		in      []byte
		want    ModeSense
		wantErr bool
	}{
		{"WP DPOFUA WCE", hdr(0x90, 0, caching(true)...), ModeSense{WriteProtect: true, DPOFUA: true, CachingPage: true, WCE: true}, false},
		{"block descriptor skipped, WCE off", hdr(0x10, 8, caching(false)...), ModeSense{DPOFUA: true, CachingPage: true}, false},
		{"all pages with subpage", hdr(0, 0, append(append(append([]byte{}, control...), subpage...), caching(true)...)...),
			ModeSense{CachingPage: true, WCE: true}, false},
		{"no caching page", hdr(0x80, 0, control...), ModeSense{WriteProtect: true}, false},
		{"truncated page", hdr(0, 0, 0x08, 18), ModeSense{}, false},
		{"short header", []byte{0, 6, 0, 0x80}, ModeSense{}, true},
	}
	for _, tt := range tests {
		got, err := ParseModeSense10(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("%s: got %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
}

func TestParseReportLUNs(t *testing.T) {
	b := []byte{0, 0, 0, 24, 0, 0, 0, 0,
		0, 0, 0, 0, 0, 0, 0, 0,
		0, 1, 0, 0, 0, 0, 0, 0,
		0x41, 0, 0, 0, 0, 0, 0, 0}
	luns, total, err := ParseReportLUNs(b)
	if err != nil || total != 3 || !reflect.DeepEqual(luns, []uint64{0, EncodeLUN(1), EncodeLUN(256)}) {
		t.Fatalf("got %x %d %v", luns, total, err)
	}
	// Allocation length too small: total says 3, only one returned.
	luns, total, err = ParseReportLUNs(b[:16])
	if err != nil || total != 3 || len(luns) != 1 {
		t.Fatalf("truncated: %x %d %v", luns, total, err)
	}
	// List length smaller than the data: trailing bytes are not LUNs.
	b[3] = 8
	if luns, _, _ := ParseReportLUNs(b); len(luns) != 1 {
		t.Fatalf("list length ignored: %x", luns)
	}
	if _, _, err := ParseReportLUNs(b[:7]); err == nil {
		t.Fatal("short data accepted")
	}
}

func TestParseOpcodeSupport(t *testing.T) {
	o, err := ParseOpcodeSupport([]byte{0, 3, 0, 16, 0x93, 0x09, 0xFF})
	if err != nil || !o.Supported() || !o.UsageBit(1, 0x01) || !o.UsageBit(1, 0x08) || o.UsageBit(1, 0x02) || o.UsageBit(9, 1) {
		t.Fatalf("got %+v %v", o, err)
	}
	if o, err := ParseOpcodeSupport([]byte{0, 1, 0, 0}); err != nil || o.Supported() {
		t.Fatalf("unsupported: %+v %v", o, err)
	}
	if _, err := ParseOpcodeSupport([]byte{0, 3}); err == nil {
		t.Fatal("short accepted")
	}
}

func TestParseBlockCharacteristics(t *testing.T) {
	tests := []struct {
		in         []byte
		rate       uint16
		rotational bool
		wantErr    bool
	}{
		{vpdPage(0xB1, []byte{0x1C, 0x20, 0, 0x02}), 7200, true, false},
		{vpdPage(0xB1, []byte{0, 1, 0, 0}), 1, false, false},
		{vpdPage(0xB1, []byte{0, 0}), 0, false, false},
		{vpdPage(0xB1, []byte{0xFF, 0xFF}), 0xFFFF, false, false},
		{vpdPage(0xB1, []byte{0}), 0, false, true},
		{vpdPage(0xB0, []byte{0, 1}), 0, false, true},
	}
	for _, tt := range tests {
		c, err := ParseBlockCharacteristics(tt.in)
		if (err != nil) != tt.wantErr || c.MediumRotationRate != tt.rate || c.Rotational() != tt.rotational {
			t.Errorf("% x: %+v %v", tt.in, c, err)
		}
	}
}
