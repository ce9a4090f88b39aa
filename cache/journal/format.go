package journal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// The on-disk format (docs/cache-dev.md). Every integer is little-endian; every checksum is
// CRC-32C (Castagnoli) computed with the checksum field itself set to zero.
//
//	offset 0          superblock copy A (SuperSize bytes)
//	offset SuperSize  superblock copy B
//	offset LogStart   the log: a ring of units of Unit bytes (4 KiB; the LUN's block size when
//	                  the LUN's size is not a multiple of 4 KiB)
//
// The log is a sequence of batches. A batch is one header (HeaderSize bytes, a whole number of
// units) followed by the data units of its data entries, in entry order, and is written with one
// system call. Each batch names the sequence number of the batch before it (PrevSeq) and carries
// a larger one itself: consecutive numbers while a process runs, and a jump past every number
// that can be on the device after a recovery, so that batches a crash left beyond the point
// where recovery stopped never continue the chain. A wrap batch (no entries) says that the next
// batch starts at the beginning of the ring.
const (
	SuperSize  = 4096
	LogStart   = 2 * SuperSize
	HeaderSize = 4096
	Version    = 1

	superMagic = "IBLKCDEV"
	batchMagic = "IBLKBAT1"

	maxURL = 1024
	maxWWN = 256

	headerFixed = 64
	entrySize   = 24
	// MaxEntries is how many entries one batch header holds.
	MaxEntries = (HeaderSize - headerFixed) / entrySize
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// ErrCorrupt is wrapped by every decoding error: the bytes are not a valid structure.
var ErrCorrupt = errors.New("journal: corrupt")

// Identity names the LUN a cache device belongs to. A cache device is never used for a LUN whose
// identity differs from the one its superblock records: its dirty data would land on the wrong
// disk.
type Identity struct {
	URL       string // the target and LUN (credentials never included)
	WWN       string // the LUN's world-wide name (VPD page 0x83) when the target reports one
	Size      int64  // the LUN's size in bytes
	BlockSize int    // the LUN's logical block size
}

// Super is one superblock copy.
type Super struct {
	Seq       uint64   // bumped by every superblock write; the valid copy with the higher one wins
	Instance  [16]byte // random at format: batches of another format never match
	ID        Identity
	Unit      int    // bytes of a ring unit: the granularity of the log and of its index
	LogUnits  uint64 // units in the ring
	TailPos   uint64 // checkpoint: the ring position (in units, never wrapping) of the oldest batch not yet written back
	TailSeq   uint64 // and that batch's sequence number
	SeqFloor  uint64 // every batch written since the last open has a sequence number >= it
	Cleaned   uint64 // bytes written back to the target since format (progress, informative)
	Formatted int64  // unix seconds of the format (informative)
}

// MarshalSuper encodes s into a SuperSize buffer.
func MarshalSuper(s *Super) ([]byte, error) {
	if len(s.ID.URL) > maxURL || len(s.ID.WWN) > maxWWN {
		return nil, fmt.Errorf("journal: identity too long (URL %d bytes, WWN %d; at most %d and %d)", len(s.ID.URL), len(s.ID.WWN), maxURL, maxWWN)
	}
	b := make([]byte, SuperSize)
	copy(b[0:8], superMagic)
	le := binary.LittleEndian
	le.PutUint32(b[8:], Version)
	le.PutUint32(b[12:], HeaderSize)
	le.PutUint64(b[16:], s.Seq)
	copy(b[24:40], s.Instance[:])
	le.PutUint32(b[40:], uint32(s.ID.BlockSize))
	le.PutUint32(b[44:], uint32(s.Unit))
	le.PutUint64(b[48:], uint64(s.ID.Size))
	le.PutUint64(b[56:], LogStart)
	le.PutUint64(b[64:], s.LogUnits)
	le.PutUint64(b[72:], s.TailPos)
	le.PutUint64(b[80:], s.TailSeq)
	le.PutUint64(b[88:], s.Cleaned)
	le.PutUint64(b[96:], uint64(s.Formatted))
	le.PutUint64(b[112:], s.SeqFloor)
	le.PutUint16(b[104:], uint16(len(s.ID.URL)))
	le.PutUint16(b[106:], uint16(len(s.ID.WWN)))
	copy(b[128:], s.ID.URL)
	copy(b[128+maxURL:], s.ID.WWN)
	le.PutUint32(b[SuperSize-4:], checksum(b))
	return b, nil
}

// UnmarshalSuper decodes a superblock copy. It fails with ErrCorrupt when b holds no valid one
// (wrong magic, version, checksum or a field out of range); errNotSuper when it holds no
// superblock at all (the magic is absent), so that Open can tell a blank device from another's.
func UnmarshalSuper(b []byte) (*Super, error) {
	if len(b) < SuperSize {
		return nil, fmt.Errorf("%w: superblock: %d bytes", ErrCorrupt, len(b))
	}
	b = b[:SuperSize]
	if string(b[0:8]) != superMagic {
		return nil, errNotSuper
	}
	le := binary.LittleEndian
	want := le.Uint32(b[SuperSize-4:])
	c := bytes.Clone(b)
	le.PutUint32(c[SuperSize-4:], 0)
	if checksum(c) != want {
		return nil, fmt.Errorf("%w: superblock checksum", ErrCorrupt)
	}
	if v := le.Uint32(b[8:]); v != Version {
		return nil, fmt.Errorf("%w: superblock version %d (this build reads %d)", ErrCorrupt, v, Version)
	}
	if h := le.Uint32(b[12:]); h != HeaderSize {
		return nil, fmt.Errorf("%w: header size %d", ErrCorrupt, h)
	}
	if ls := le.Uint64(b[56:]); ls != LogStart {
		return nil, fmt.Errorf("%w: log start %d", ErrCorrupt, ls)
	}
	s := &Super{
		Seq:       le.Uint64(b[16:]),
		LogUnits:  le.Uint64(b[64:]),
		TailPos:   le.Uint64(b[72:]),
		TailSeq:   le.Uint64(b[80:]),
		Cleaned:   le.Uint64(b[88:]),
		Formatted: int64(le.Uint64(b[96:])),
		SeqFloor:  le.Uint64(b[112:]),
	}
	copy(s.Instance[:], b[24:40])
	s.ID.BlockSize = int(le.Uint32(b[40:]))
	s.Unit = int(le.Uint32(b[44:]))
	s.ID.Size = int64(le.Uint64(b[48:]))
	urlLen, wwnLen := int(le.Uint16(b[104:])), int(le.Uint16(b[106:]))
	bs, u := s.ID.BlockSize, s.Unit
	switch {
	case bs < 512 || bs > HeaderSize || bs&(bs-1) != 0:
		return nil, fmt.Errorf("%w: block size %d", ErrCorrupt, bs)
	case u < bs || u > HeaderSize || u&(u-1) != 0:
		return nil, fmt.Errorf("%w: unit %d", ErrCorrupt, u)
	case s.ID.Size <= 0 || s.ID.Size%int64(u) != 0:
		return nil, fmt.Errorf("%w: LUN size %d", ErrCorrupt, s.ID.Size)
	case s.LogUnits < 2*uint64(HeaderSize/u) || s.LogUnits > 1<<32-1:
		return nil, fmt.Errorf("%w: log of %d units", ErrCorrupt, s.LogUnits)
	case urlLen > maxURL || wwnLen > maxWWN:
		return nil, fmt.Errorf("%w: identity lengths %d/%d", ErrCorrupt, urlLen, wwnLen)
	}
	s.ID.URL = string(b[128 : 128+urlLen])
	s.ID.WWN = string(b[128+maxURL : 128+maxURL+wwnLen])
	return s, nil
}

var errNotSuper = errors.New("journal: no superblock")

// Batch kinds.
const (
	kindData = 1 // entries follow, with their data units
	kindWrap = 2 // no entries: the next batch starts at ring position 0
)

// Entry flags.
const (
	entryData       = 0 // Blocks units of data follow in the batch
	entryInvalidate = 1 // the range went to the target around the log (a large write, a discard,
	// a write-zeroes): older log data of it must never be replayed over it
)

// Entry is one record of a batch: a write of Blocks logical blocks at LBA, or an invalidation.
type Entry struct {
	LBA    uint64
	Blocks uint32
	Flags  uint32
	CRC    uint32 // of the data units (zero for an invalidation)
}

// Header is a batch header.
type Header struct {
	Instance  [16]byte
	Seq       uint64
	PrevSeq   uint64 // the sequence number of the batch before it in the ring: the chain recovery follows
	Kind      uint16
	DataUnits uint32 // units of data after the header
	Entries   []Entry
}

// MarshalHeader encodes h into b (HeaderSize bytes), reusing b's memory.
func MarshalHeader(h *Header, b []byte) {
	clear(b[:HeaderSize])
	le := binary.LittleEndian
	copy(b[0:8], batchMagic)
	copy(b[8:24], h.Instance[:])
	le.PutUint64(b[24:], h.Seq)
	le.PutUint16(b[32:], h.Kind)
	le.PutUint16(b[34:], uint16(len(h.Entries)))
	le.PutUint32(b[36:], h.DataUnits)
	le.PutUint64(b[40:], h.PrevSeq)
	for i, e := range h.Entries {
		o := headerFixed + i*entrySize
		le.PutUint64(b[o:], e.LBA)
		le.PutUint32(b[o+8:], e.Blocks)
		le.PutUint32(b[o+12:], e.Flags)
		le.PutUint32(b[o+16:], e.CRC)
	}
	le.PutUint32(b[60:], checksum(b[:HeaderSize]))
}

// UnmarshalHeader decodes a batch header into h (reusing h.Entries). It checks the magic, the
// checksum and the internal consistency of the header; the caller checks the instance, the
// sequence number and that the batch fits the ring.
func UnmarshalHeader(b []byte, h *Header) error {
	if len(b) < HeaderSize {
		return fmt.Errorf("%w: batch header: %d bytes", ErrCorrupt, len(b))
	}
	b = b[:HeaderSize]
	if string(b[0:8]) != batchMagic {
		return fmt.Errorf("%w: batch magic", ErrCorrupt)
	}
	le := binary.LittleEndian
	want := le.Uint32(b[60:])
	var zero [4]byte
	crc := crc32.Update(0, castagnoli, b[:60])
	crc = crc32.Update(crc, castagnoli, zero[:])
	crc = crc32.Update(crc, castagnoli, b[64:])
	if crc != want {
		return fmt.Errorf("%w: batch header checksum", ErrCorrupt)
	}
	copy(h.Instance[:], b[8:24])
	h.Seq = le.Uint64(b[24:])
	h.Kind = le.Uint16(b[32:])
	n := int(le.Uint16(b[34:]))
	h.DataUnits = le.Uint32(b[36:])
	h.PrevSeq = le.Uint64(b[40:])
	if n > MaxEntries {
		return fmt.Errorf("%w: %d entries", ErrCorrupt, n)
	}
	h.Entries = h.Entries[:0]
	units := uint64(0)
	for i := range n {
		o := headerFixed + i*entrySize
		e := Entry{LBA: le.Uint64(b[o:]), Blocks: le.Uint32(b[o+8:]), Flags: le.Uint32(b[o+12:]), CRC: le.Uint32(b[o+16:])}
		switch e.Flags {
		case entryData:
			units += uint64(e.Blocks)
		case entryInvalidate:
		default:
			return fmt.Errorf("%w: entry flags %#x", ErrCorrupt, e.Flags)
		}
		if e.Blocks == 0 {
			return fmt.Errorf("%w: empty entry", ErrCorrupt)
		}
		h.Entries = append(h.Entries, e)
	}
	switch {
	case h.Kind == kindWrap && (n != 0 || h.DataUnits != 0):
		return fmt.Errorf("%w: wrap batch with entries", ErrCorrupt)
	case h.Kind != kindWrap && h.Kind != kindData:
		return fmt.Errorf("%w: batch kind %d", ErrCorrupt, h.Kind)
	case units != uint64(h.DataUnits):
		return fmt.Errorf("%w: entries carry %d units, header says %d", ErrCorrupt, units, h.DataUnits)
	}
	return nil
}
