package journal

// Fuzz targets for every decoder of bytes read from the cache device, which may hold anything:
// the superblock, the batch header, and recovery as a whole. Checksums stop a mutator at the
// first byte it changes, so each target can also fix them up (fix) to reach the checks behind.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/cache/internal/fakedev"
)

// fixSuper sets the checksum of the superblock copy at b[0:SuperSize].
func fixSuper(b []byte) {
	binary.LittleEndian.PutUint32(b[SuperSize-4:], 0)
	binary.LittleEndian.PutUint32(b[SuperSize-4:], checksum(b[:SuperSize]))
}

// fixHeader sets the checksum of the batch header at b[0:HeaderSize].
func fixHeader(b []byte) {
	binary.LittleEndian.PutUint32(b[60:], 0)
	binary.LittleEndian.PutUint32(b[60:], checksum(b[:HeaderSize]))
}

// padded is b zero-extended to n bytes: the fuzzer's inputs need not carry the zeroes that fill
// most of a superblock or a header (an input that must stay 4 KiB long makes the fuzzer's
// minimization of it quadratic, and it then does nothing else).
func padded(b []byte, n int) []byte {
	p := make([]byte, max(n, len(b)))
	copy(p, b)
	return p
}

func FuzzUnmarshalSuper(f *testing.F) {
	s := &Super{Seq: 3, Instance: [16]byte{1, 2, 3}, ID: testID, LogUnits: 4094, TailPos: 70, TailSeq: 9,
		SeqFloor: 5, Cleaned: 1 << 20, Formatted: 1796400000}
	s.ID.Size, s.ID.BlockSize = 8<<20, 4096
	b, err := MarshalSuper(s)
	if err != nil {
		f.Fatal(err)
	}
	// An input is laid over a zeroed superblock: all but its last 4 bytes from the start, those
	// as the checksum, so that a valid superblock needs no 4 KiB input.
	compact := func(b []byte) []byte {
		return append(bytes.TrimRight(b[:SuperSize-4], "\x00"), b[SuperSize-4:]...)
	}
	f.Add(compact(b), false)
	f.Add(compact(b), true)
	f.Add([]byte{}, true)
	junk := bytes.Clone(b)
	copy(junk[104:], []byte{0xff, 0xff})
	f.Add(compact(junk), true)
	f.Fuzz(func(t *testing.T, in []byte, fix bool) {
		if len(in) < SuperSize {
			if _, err := UnmarshalSuper(in); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("a short superblock (%d bytes): %v", len(in), err)
			}
		}
		b := make([]byte, SuperSize)
		if n := len(in) - 4; n >= 0 {
			copy(b[:SuperSize-4], in[:n])
			copy(b[SuperSize-4:], in[n:])
		}
		if fix {
			fixSuper(b)
		}
		s, err := UnmarshalSuper(b)
		if err != nil {
			if s != nil || (!errors.Is(err, ErrCorrupt) && !errors.Is(err, errNotSuper)) {
				t.Fatalf("a failed decode: %v, %v", s, err)
			}
			return
		}
		b2, err := MarshalSuper(s)
		if err != nil {
			t.Fatalf("a decoded superblock does not encode: %v (%+v)", err, s)
		}
		s2, err := UnmarshalSuper(b2)
		if err != nil {
			t.Fatalf("a re-encoded superblock does not decode: %v", err)
		}
		if !reflect.DeepEqual(s, s2) {
			t.Fatalf("round trip: %+v became %+v", s, s2)
		}
	})
}

func FuzzUnmarshalHeader(f *testing.F) {
	b := make([]byte, HeaderSize)
	MarshalHeader(&Header{Instance: [16]byte{9}, Seq: 12, PrevSeq: 11, Kind: kindData, DataUnits: 3, Entries: []Entry{
		{LBA: 100, Blocks: 2, CRC: 7}, {LBA: 5, Blocks: 9, Flags: entryInvalidate}, {LBA: 1 << 40, Blocks: 1, CRC: 1}}}, b)
	f.Add(bytes.TrimRight(b, "\x00"), false)
	f.Add(bytes.TrimRight(b, "\x00"), true)
	w := make([]byte, HeaderSize)
	MarshalHeader(&Header{Seq: 13, PrevSeq: 12, Kind: kindWrap}, w)
	f.Add(bytes.TrimRight(w, "\x00"), false)
	f.Add([]byte{}, true)
	f.Add([]byte(batchMagic), true)
	f.Fuzz(func(t *testing.T, in []byte, fix bool) {
		if len(in) < HeaderSize {
			if err := UnmarshalHeader(in, &Header{}); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("a short header (%d bytes): %v", len(in), err)
			}
		}
		b := padded(in, HeaderSize)
		if fix {
			fixHeader(b)
		}
		var h Header
		if err := UnmarshalHeader(b, &h); err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("a failed decode: %v", err)
			}
			return
		}
		b2 := make([]byte, HeaderSize)
		MarshalHeader(&h, b2)
		var h2 Header
		if err := UnmarshalHeader(b2, &h2); err != nil {
			t.Fatalf("a re-encoded header does not decode: %v (%+v)", err, h)
		}
		if len(h.Entries) == 0 && len(h2.Entries) == 0 {
			h.Entries, h2.Entries = nil, nil
		}
		if !reflect.DeepEqual(h, h2) {
			t.Fatalf("round trip: %+v became %+v", h, h2)
		}
	})
}

// fuzzLUN is the target of FuzzRecover's journals.
const fuzzLUN = 1 << 20

// prefixMedia is a cache device of MinSize bytes that holds buf at its start and zeroes after
// it: a fuzz input costs what it holds, not 16 MiB, so that the fuzzer runs (and minimizes) fast.
type prefixMedia struct{ buf []byte }

func (m *prefixMedia) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > MinSize {
		return 0, io.EOF
	}
	clear(p)
	if off < int64(len(m.buf)) {
		copy(p, m.buf[off:])
	}
	return len(p), nil
}

func (m *prefixMedia) WriteVAt(bufs [][]byte, off int64) error {
	for _, b := range bufs {
		if off < 0 || off+int64(len(b)) > MinSize {
			return fmt.Errorf("prefixmedia: write at %d+%d past the device", off, len(b))
		}
		if end := off + int64(len(b)); end > int64(len(m.buf)) {
			m.buf = append(m.buf, make([]byte, end-int64(len(m.buf)))...)
		}
		copy(m.buf[off:], b)
		off += int64(len(b))
	}
	return nil
}

func (m *prefixMedia) Sync() error  { return nil }
func (m *prefixMedia) Size() int64  { return MinSize }
func (m *prefixMedia) Close() error { return nil }

// recoverSeed is a real cache device (MinSize) after a short workload, in the sparse form of
// decodeImage: the two superblocks and the first batches (their data mostly zeroes, so that the
// input stays small).
func recoverSeed(f *testing.F, bs uint32, flush bool) []byte {
	m := newMemMedia(MinSize)
	j, err := Open(m, fakedev.New(fuzzLUN, targetLimits(bs)), testID, Options{CleanAfter: time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	for i := range 4 {
		p := make([]byte, (1+i%2)*4096)
		p[0], p[len(p)-1] = byte(i+1), 0xa5
		if err := j.WriteAt(ctx, p, int64(i)*8192, 0); err != nil {
			f.Fatal(err)
		}
	}
	if err := j.Discard(ctx, 8192, 4096); err != nil { // an invalidation entry
		f.Fatal(err)
	}
	if flush {
		if err := j.Flush(ctx); err != nil {
			f.Fatal(err)
		}
	}
	if err := j.Abandon(); err != nil {
		f.Fatal(err)
	}
	img := m.cur[:LogStart+int(j.head)*int(j.u)]
	enc := encodeImage(img)
	dec := decodeImage(enc)
	if !bytes.Equal(dec, bytes.TrimRight(img, "\x00")) {
		f.Fatal("the sparse form of the seed image does not decode to it")
	}
	// The seed must reach recovery's work: a device that recovers data.
	j2, err := Open(&prefixMedia{buf: dec}, fakedev.New(fuzzLUN, targetLimits(bs)), testID, Options{CleanAfter: time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	if s := j2.Stats(); s.DirtyBytes == 0 {
		f.Fatalf("the seed image recovers nothing: %+v", s)
	}
	if err := j2.Abandon(); err != nil {
		f.Fatal(err)
	}
	return enc
}

// The images FuzzRecover opens are given in a sparse form, so that inputs (and the fuzzer's
// minimization of them) stay small: chunks, each a 4-byte little-endian offset (modulo
// imageLimit), a 2-byte length (modulo 4097) and that many bytes, laid over zeroes.
const imageLimit = 1 << 20

func decodeImage(in []byte) []byte {
	var img []byte
	le := binary.LittleEndian
	for len(in) >= 6 {
		off := int(le.Uint32(in) % imageLimit)
		n := min(int(le.Uint16(in[4:])%4097), len(in)-6)
		in = in[6:]
		if end := off + n; end > len(img) {
			img = append(img, make([]byte, end-len(img))...)
		}
		copy(img[off:], in[:n])
		in = in[n:]
	}
	return img
}

// encodeImage is decodeImage's inverse: the runs of img that are not zeroes (gaps shorter than
// a chunk's own 6 bytes included).
func encodeImage(img []byte) []byte {
	var out []byte
	le := binary.LittleEndian
	for i := 0; i < len(img); {
		if img[i] == 0 {
			i++
			continue
		}
		end, k := i, i
		for k < len(img) && k-i < 4096 && k-end < 6 {
			if img[k] != 0 {
				end = k + 1
			}
			k++
		}
		out = le.AppendUint32(out, uint32(i))
		out = le.AppendUint16(out, uint16(end-i))
		out = append(out, img[i:end]...)
		i = end
	}
	return out
}

// fixImage sets the checksums of every superblock copy and batch header the image holds (by
// their magic), and of the data of the header's entries, so that the mutator's changes to the
// fields reach recovery's checks of the structure.
func fixImage(img []byte, bs int) {
	for c := range 2 {
		if b := img[c*SuperSize:]; string(b[:8]) == superMagic {
			fixSuper(b)
		}
	}
	le := binary.LittleEndian
	for off := LogStart; off+HeaderSize <= len(img); off += bs {
		b := img[off:]
		if string(b[:8]) != batchMagic {
			continue
		}
		d := off + HeaderSize
		for i := range min(int(le.Uint16(b[34:])), MaxEntries) {
			e := b[headerFixed+i*entrySize:]
			if le.Uint32(e[12:]) != entryData {
				continue
			}
			n := int(le.Uint32(e[8:])) * bs
			if n <= 0 || d+n > len(img) {
				break
			}
			le.PutUint32(e[16:], checksum(img[d:d+n]))
			d += n
		}
		fixHeader(b)
	}
}

// FuzzRecover opens arbitrary cache device contents: it never panics or hangs, and either
// refuses them with an error or gives a journal that reads the whole LUN and detaches.
func FuzzRecover(f *testing.F) {
	for _, bs := range []uint32{4096, 512} {
		for _, flush := range []bool{true, false} {
			img := recoverSeed(f, bs, flush)
			f.Add(img, bs == 512, false)
			f.Add(img, bs == 512, true)
		}
		// A batch whose checksums hold but whose first entry lies past the end of the LUN, and a
		// superblock that claims a ring larger than the device.
		img := decodeImage(recoverSeed(f, bs, true))
		binary.LittleEndian.PutUint64(img[LogStart+headerFixed:], fuzzLUN/uint64(bs))
		f.Add(encodeImage(img), bs == 512, true)
		img = decodeImage(recoverSeed(f, bs, true))
		for c := range 2 {
			binary.LittleEndian.PutUint64(img[c*SuperSize+64:], 1<<33)
		}
		f.Add(encodeImage(img), bs == 512, true)
	}
	f.Add([]byte{}, false, false)
	f.Add([]byte("IBLKCDEV"), false, true)
	f.Fuzz(func(t *testing.T, data []byte, small, fix bool) {
		bs := uint32(4096)
		if small {
			bs = 512
		}
		m := &prefixMedia{buf: decodeImage(data)}
		if fix {
			if len(m.buf) < LogStart {
				m.buf = append(m.buf, make([]byte, LogStart-len(m.buf))...)
			}
			fixImage(m.buf, int(bs))
		}
		be := fakedev.New(fuzzLUN, targetLimits(bs))
		// One write-back worker: with more, which code runs varies from run to run, the fuzzer
		// takes that for new coverage and spends its time minimizing.
		j, err := Open(m, be, testID, Options{CleanAfter: time.Hour, Workers: 1})
		if err != nil {
			return
		}
		buf := make([]byte, 1<<20)
		for off := int64(0); off < fuzzLUN; off += int64(len(buf)) {
			if err := j.ReadAt(ctx, buf, off); err != nil {
				t.Fatalf("read at %d of a recovered journal: %v", off, err)
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := j.CloseContext(cctx); err != nil {
			t.Fatalf("detach of a recovered journal: %v", err)
		}
		if ov := be.Overlaps(); len(ov) > 0 {
			t.Fatalf("overlapping writes to the target: %v", ov)
		}
	})
}
