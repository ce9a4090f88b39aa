package scsi

import (
	"errors"
	"testing"

	"github.com/iser-blk/iser-blk/block"
)

// The fuzz targets feed target-supplied bytes to every decoder: none may panic, and the results
// must be self-consistent.

func FuzzParseSense(f *testing.F) {
	f.Add(fixedSense(KeyMediumError, 0x11, 0, 7, true))
	f.Add(descSense(KeyIllegalRequest, 0x21, 0, 1<<40))
	f.Add([]byte{0x72, 0x05, 0x24, 0, 0, 0, 0, 8, 0x02, 0x06, 0, 0, 0xC0, 0, 0x01, 0})
	f.Add([]byte{0x73, 0x02, 0x04, 0x01, 0, 0, 0, 255, 0x00, 0xFF})
	f.Add([]byte{0x71, 0, 6})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseSense(b)
		if err != nil {
			return
		}
		if s.Key > 0xF || s.ResponseCode < 0x70 || s.ResponseCode > 0x73 {
			t.Fatalf("impossible sense %+v", s)
		}
		var resp Response
		resp.Status = StatusCheckCondition
		resp.SenseLen = uint8(copy(resp.Sense[:], b))
		err = CheckStatus(&resp)
		if err == nil || err.Error() == "" {
			t.Fatal("CHECK CONDITION without an error")
		}
		n := 0
		for _, s := range []error{block.ErrIO, block.ErrInvalid, block.ErrReadOnly, block.ErrNoSpace, block.ErrNotSupported, block.ErrMedium} {
			if errors.Is(err, s) {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%v matches %d sentinels", err, n)
		}
		_ = Classify(&resp)
	})
}

func FuzzParseInquiry(f *testing.F) {
	f.Add(append([]byte{0, 0, 6, 0x12, 31, 0, 0, 2}, "VENDOR  PRODUCT         REV1"...))
	f.Add([]byte{0x7F, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		q, err := ParseInquiry(b)
		if err == nil && (len(q.Vendor) > 8 || len(q.Product) > 16 || len(q.Revision) > 4) {
			t.Fatalf("fields too long: %+v", q)
		}
	})
}

func FuzzParseVPD(f *testing.F) {
	f.Add(vpdPage(0x00, []byte{0, 0x80, 0x83, 0xB0, 0xB2}))
	f.Add(vpdPage(0x80, []byte("serial")))
	f.Add(vpdPage(0x83, []byte{0x01, 0x03, 0x00, 0x08, 1, 2, 3, 4, 5, 6, 7, 8, 0x53, 0xA8, 0, 4, 'i', 'q', 'n', '.'}))
	f.Add(vpdPage(0xB0, make([]byte, 0x3C)))
	f.Add(vpdPage(0xB2, []byte{0, 0xE4, 2, 0}))
	f.Add([]byte{0, 0xB0, 0xFF, 0xFF})
	f.Add(vpdPage(0xB1, []byte{0x1C, 0x20, 0, 0x02}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if c, err := ParseBlockCharacteristics(b); err == nil && c.FormFactor > 0x0F {
			t.Fatalf("form factor out of range: %+v", c)
		}
		if p, err := ParseSupportedVPDPages(b); err == nil && len(p) > len(b) {
			t.Fatal("more pages than bytes")
		}
		_, _ = ParseUnitSerial(b)
		if ds, err := ParseDeviceIdentification(b); err == nil {
			total := 0
			for _, d := range ds {
				total += 4 + len(d.Value)
				_ = d.String()
			}
			if total > len(b) {
				t.Fatalf("designators cover %d bytes of %d", total, len(b))
			}
		}
		if bl, err := ParseBlockLimits(b); err == nil && bl.UnmapGranularityAlignment > 0x7FFFFFFF {
			t.Fatal("UGA bit leaked into the alignment")
		}
		if l, err := ParseLogicalBlockProvisioning(b); err == nil && (l.LBPRZ > 7 || l.ProvisioningType > 7) {
			t.Fatalf("field out of range: %+v", l)
		}
	})
}

func FuzzParseCapacity(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 0x0F, 0xFF, 0xFF, 0, 0, 0x10, 0, 0x05, 0x13, 0xC0, 0x07})
	f.Add([]byte{0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 2, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, parse := range []func([]byte) (Capacity, error){ParseReadCapacity10, ParseReadCapacity16} {
			c, err := parse(b)
			if err != nil {
				continue
			}
			if c.Validate() == nil {
				if c.Bytes()/uint64(c.BlockSize) != c.Blocks() || int64(c.Bytes()) < 0 {
					t.Fatalf("validated capacity overflows: %+v", c)
				}
				if c.PhysicalBlockSize() < uint64(c.BlockSize) {
					t.Fatalf("physical < logical: %+v", c)
				}
			}
		}
	})
}

func FuzzParseModeSense10(f *testing.F) {
	f.Add([]byte{0, 26, 0, 0x90, 0, 0, 0, 0, 0x08, 18, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0, 14, 0, 0, 0, 0, 0, 0, 0x4A, 0x01, 0, 4, 0xFF, 0xFF, 0xFF, 0xFF})
	f.Add([]byte{0xFF, 0xFF, 0, 0, 0, 0, 0xFF, 0xFF})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseModeSense10(b)
		if err == nil && !m.CachingPage && (m.WCE || m.RCD) {
			t.Fatalf("cache bits without a caching page: %+v", m)
		}
	})
}

func FuzzParseReportLUNs(f *testing.F) {
	f.Add([]byte{0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		luns, _, err := ParseReportLUNs(b)
		if err == nil && 8+8*len(luns) > len(b) {
			t.Fatalf("%d LUNs from %d bytes", len(luns), len(b))
		}
		// A LUN has more than one valid encoding (flat space addressing may carry a number
		// below 256 that EncodeLUN writes in peripheral form, as Linux's int_to_scsilun does),
		// so the property is that the number survives the round trip, not the bytes.
		for _, l := range luns {
			v, ok := DecodeLUN(l)
			if !ok {
				continue
			}
			if w, ok := DecodeLUN(EncodeLUN(v)); !ok || w != v {
				t.Fatalf("LUN %016x decodes to %d, which encodes to %016x and decodes to %d (%v)", l, v, EncodeLUN(v), w, ok)
			}
		}
		if o, err := ParseOpcodeSupport(b); err == nil && len(o.Usage) > len(b) {
			t.Fatal("usage longer than data")
		}
	})
}
