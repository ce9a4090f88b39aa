package scsi

import (
	"encoding/binary"
	"fmt"
)

// Capacity is READ CAPACITY parameter data (SBC-4 §5.20.2, §5.21.2).
type Capacity struct {
	LastLBA   uint64 // RETURNED LOGICAL BLOCK ADDRESS: the last addressable block
	BlockSize uint32 // LOGICAL BLOCK LENGTH IN BYTES
	// The fields below come from READ CAPACITY(16) only.
	ProtType           uint8 // P_TYPE
	ProtEnabled        bool  // PROT_EN
	PIExponent         uint8 // P_I_EXPONENT
	PhysBlockExponent  uint8 // LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT
	LBPME              bool  // logical block provisioning management enabled (thin)
	LBPRZ              bool  // unmapped blocks read back as zeroes
	LowestAlignedLBA   uint16
	FromReadCapacity16 bool
}

// Blocks is the number of logical blocks.
func (c Capacity) Blocks() uint64 { return c.LastLBA + 1 }

// Bytes is the capacity in bytes.
func (c Capacity) Bytes() uint64 { return c.Blocks() * uint64(c.BlockSize) }

// PhysicalBlockSize is the physical block size in bytes (at least the logical one).
func (c Capacity) PhysicalBlockSize() uint64 {
	if c.PhysBlockExponent > 16 {
		return uint64(c.BlockSize)
	}
	return uint64(c.BlockSize) << c.PhysBlockExponent
}

// Validate rejects capacity data a sane disk cannot report: a block size that is zero, not a
// power of two or outside 512 B..64 KiB, or a byte size that overflows int64.
func (c Capacity) Validate() error {
	bs := c.BlockSize
	if bs < 512 || bs > 65536 || bs&(bs-1) != 0 {
		return fmt.Errorf("scsi: target reports logical block length %d", bs)
	}
	if c.LastLBA == ^uint64(0) || c.Blocks() > uint64(1<<63-1)/uint64(bs) {
		return fmt.Errorf("scsi: target reports %d blocks of %d bytes: too large", c.LastLBA, bs)
	}
	return nil
}

// ReadCapacity10Exceeded is the RETURNED LOGICAL BLOCK ADDRESS of READ CAPACITY(10) when the
// capacity needs READ CAPACITY(16) (SBC-4 §5.20.2).
const ReadCapacity10Exceeded = 0xFFFFFFFF

// ParseReadCapacity10 decodes the 8-byte READ CAPACITY(10) parameter data.
func ParseReadCapacity10(b []byte) (Capacity, error) {
	if len(b) < 8 {
		return Capacity{}, fmt.Errorf("READ CAPACITY(10): %w (%d bytes)", ErrShortData, len(b))
	}
	return Capacity{
		LastLBA:   uint64(binary.BigEndian.Uint32(b[0:4])),
		BlockSize: binary.BigEndian.Uint32(b[4:8]),
	}, nil
}

// ParseReadCapacity16 decodes READ CAPACITY(16) parameter data. The first 12 bytes are required;
// the rest reads as zero when the target sent fewer than 32.
func ParseReadCapacity16(b []byte) (Capacity, error) {
	if len(b) < 12 {
		return Capacity{}, fmt.Errorf("READ CAPACITY(16): %w (%d bytes)", ErrShortData, len(b))
	}
	c := Capacity{
		LastLBA:            binary.BigEndian.Uint64(b[0:8]),
		BlockSize:          binary.BigEndian.Uint32(b[8:12]),
		FromReadCapacity16: true,
	}
	if len(b) > 12 {
		c.ProtType = (b[12] >> 1) & 0x07
		c.ProtEnabled = b[12]&0x01 != 0
	}
	if len(b) > 13 {
		c.PIExponent = b[13] >> 4
		c.PhysBlockExponent = b[13] & 0x0F
	}
	if len(b) > 15 {
		c.LBPME = b[14]&0x80 != 0
		c.LBPRZ = b[14]&0x40 != 0
		c.LowestAlignedLBA = binary.BigEndian.Uint16(b[14:16]) & 0x3FFF
	}
	return c, nil
}
