package scsi

import (
	"encoding/binary"
	"fmt"
)

// ModeSense is what iser-blk reads from MODE SENSE(10) data (SPC-5 §7.5.6 header, SBC-4 §6.5.1
// device-specific parameter, SBC-4 §6.5.5 caching page).
type ModeSense struct {
	WriteProtect bool // WP: the medium is write-protected
	DPOFUA       bool // the DPO and FUA bits are supported
	// CachingPage is true when the caching mode page (0x08) was present; WCE and RCD are only
	// meaningful then.
	CachingPage bool
	WCE         bool // write cache enabled: GOOD may precede durability
	RCD         bool // read cache disabled
}

// ParseModeSense10 decodes MODE SENSE(10) parameter data: the 8-byte header, block descriptors
// (skipped) and mode pages, looking for the caching page. Pages running past the data end the
// walk; what was decoded until then is kept.
func ParseModeSense10(b []byte) (ModeSense, error) {
	var m ModeSense
	if len(b) < 8 {
		return m, fmt.Errorf("MODE SENSE(10): %w (%d bytes)", ErrShortData, len(b))
	}
	n := 2 + int(binary.BigEndian.Uint16(b[0:2]))
	if n < 8 {
		return m, fmt.Errorf("MODE SENSE(10): mode data length %d is shorter than the header", n-2)
	}
	if n < len(b) {
		b = b[:n]
	}
	m.WriteProtect = b[3]&0x80 != 0
	m.DPOFUA = b[3]&0x10 != 0
	p := 8 + int(binary.BigEndian.Uint16(b[6:8])) // skip block descriptors
	for p+2 <= len(b) {
		code := b[p] & 0x3F
		spf := b[p]&0x40 != 0
		var hdr, n int
		if spf { // sub-page format: 2-byte page length at bytes 2..3
			if p+4 > len(b) {
				break
			}
			hdr, n = 4, int(binary.BigEndian.Uint16(b[p+2:p+4]))
		} else {
			hdr, n = 2, int(b[p+1])
		}
		page := b[p+hdr : min(p+hdr+n, len(b))]
		if code == ModePageCaching && !spf && len(page) >= 1 {
			m.CachingPage = true
			m.WCE = page[0]&0x04 != 0
			m.RCD = page[0]&0x01 != 0
		}
		p += hdr + n
	}
	return m, nil
}
