// Package memdev is an in-memory block.Device with configurable limits.
//
// It exists for tests and benchmarks: it is the "cost of the frontend protocol alone" baseline (no
// network, no SCSI) and the test-only target `mem://SIZE` of the CLI. Storage is sparse: the
// device is split into fixed chunks allocated on first write, so a large device costs only what
// was written. A discarded or zeroed whole chunk is released and reads back as zeroes.
//
// Invariants: every method validates its range with block.CheckRange before touching memory;
// every method is safe for concurrent use (one RWMutex per chunk, taken in ascending order, so
// readers and writers of disjoint ranges never wait on each other and overlapping requests never
// tear within a chunk); the caller's buffer is never retained.
package memdev

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/dustin/go-humanize"

	"github.com/iser-blk/iser-blk/block"
)

// chunkSize is the allocation unit of the sparse store.
const chunkSize = 1 << 20

// Options configure a Device. The zero value of a field means its default.
type Options struct {
	// BlockSize is the logical block size (default 512).
	BlockSize uint32
	// Limits overrides the advertised limits. When nil, the device advertises everything it
	// can do: flush, FUA, discard (reads back zeroes), write-zeroes with fast zeroing, multi-conn.
	// LogicalBlockSize in it is forced to BlockSize.
	Limits *block.Limits
}

type chunk struct {
	mu   sync.RWMutex
	data []byte // nil: reads as zeroes
}

// Stats counts the calls a Device has served, for tests.
type Stats struct {
	Reads, Writes, FUAWrites, Flushes, Discards, WriteZeroes int64
}

// Device is an in-memory block device.
type Device struct {
	size   int64
	bs     int
	limits block.Limits
	chunks []chunk
	closed atomic.Bool

	reads, writes, fuaWrites, flushes, discards, zeroes atomic.Int64
}

// New returns a device of size bytes (a multiple of the block size).
func New(size int64, opts Options) (*Device, error) {
	bs := opts.BlockSize
	if bs == 0 {
		bs = 512
	}
	if bs&(bs-1) != 0 || bs < 512 || bs > 65536 {
		return nil, fmt.Errorf("memdev: block size %d is not a power of two in [512, 65536]: %w", bs, block.ErrInvalid)
	}
	if size <= 0 || size%int64(bs) != 0 {
		return nil, fmt.Errorf("memdev: size %d is not a positive multiple of the block size %d: %w", size, bs, block.ErrInvalid)
	}
	lim := block.Limits{
		PhysicalBlockSize: bs,
		MaxTransfer:       32 << 20,
		OptimalTransfer:   1 << 20,
		VolatileCache:     true,
		CanFlush:          true,
		CanFUA:            true,
		CanDiscard:        true,
		CanWriteZeroes:    true,
		CanFastZero:       true,
		DiscardZeroes:     true,
		MultiConn:         true,
	}
	if opts.Limits != nil {
		lim = *opts.Limits
	}
	lim.LogicalBlockSize = bs
	if lim.PhysicalBlockSize < bs {
		lim.PhysicalBlockSize = bs
	}
	return &Device{
		size:   size,
		bs:     int(bs),
		limits: lim,
		chunks: make([]chunk, (size+chunkSize-1)/chunkSize),
	}, nil
}

// ParseURL opens a device described by a test URL: mem://SIZE[?bs=N&ro=1&maxtransfer=SIZE&
// nodiscard=1&nozero=1&noflush=1&nomulticonn=1]. SIZE accepts units (256MiB, 1G).
func ParseURL(raw string) (*Device, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("memdev: %q: %w", raw, err)
	}
	if u.Scheme != "mem" {
		return nil, fmt.Errorf("memdev: %q: scheme is not mem: %w", raw, block.ErrInvalid)
	}
	sizeText := u.Host + strings.TrimPrefix(u.Path, "/")
	size, err := humanize.ParseBytes(sizeText)
	if err != nil || size == 0 || size > 1<<50 {
		return nil, fmt.Errorf("memdev: %q: bad size %q: %w", raw, sizeText, block.ErrInvalid)
	}
	q := u.Query()
	opts := Options{}
	if v := q.Get("bs"); v != "" {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("memdev: %q: bad bs: %w", raw, block.ErrInvalid)
		}
		opts.BlockSize = uint32(n)
	}
	bs := int64(opts.BlockSize)
	if bs == 0 {
		bs = 512
	}
	d, err := New(int64(size)/bs*bs, opts)
	if err != nil {
		return nil, err
	}
	on := func(k string) bool { v := q.Get(k); return v == "1" || v == "true" }
	if on("ro") {
		d.limits.ReadOnly = true
		d.limits.CanDiscard, d.limits.CanWriteZeroes, d.limits.CanFastZero = false, false, false
	}
	if on("nodiscard") {
		d.limits.CanDiscard = false
	}
	if on("nozero") {
		d.limits.CanWriteZeroes, d.limits.CanFastZero = false, false
	}
	if on("noflush") {
		d.limits.CanFlush, d.limits.CanFUA, d.limits.VolatileCache = false, false, false
	}
	if on("nomulticonn") {
		d.limits.MultiConn = false
	}
	if v := q.Get("maxtransfer"); v != "" {
		n, err := humanize.ParseBytes(v)
		if err != nil || n == 0 || int64(n)%bs != 0 {
			return nil, fmt.Errorf("memdev: %q: bad maxtransfer: %w", raw, block.ErrInvalid)
		}
		d.limits.MaxTransfer = int64(n)
	}
	return d, nil
}

// Size implements block.Device.
func (d *Device) Size() int64 { return d.size }

// BlockSize implements block.Device.
func (d *Device) BlockSize() int { return d.bs }

// Limits implements block.Device.
func (d *Device) Limits() block.Limits { return d.limits }

// Stats returns the call counters.
func (d *Device) Stats() Stats {
	return Stats{
		Reads: d.reads.Load(), Writes: d.writes.Load(), FUAWrites: d.fuaWrites.Load(),
		Flushes: d.flushes.Load(), Discards: d.discards.Load(), WriteZeroes: d.zeroes.Load(),
	}
}

func (d *Device) check(ctx context.Context, off, length int64, write bool) error {
	if d.closed.Load() {
		return block.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return block.ContextError(err)
	}
	if write && d.limits.ReadOnly {
		return block.ErrReadOnly
	}
	return block.CheckRange(d, off, length)
}

// span calls fn for each chunk piece of [off, off+n): chunk index, offset inside the chunk, and
// the offset of the piece relative to off.
func span(off, n int64, fn func(ci int, in int64, rel int64, l int64)) {
	rel := int64(0)
	for rel < n {
		pos := off + rel
		ci := int(pos / chunkSize)
		in := pos % chunkSize
		l := min(chunkSize-in, n-rel)
		fn(ci, in, rel, l)
		rel += l
	}
}

// ReadAt implements block.Device.
func (d *Device) ReadAt(ctx context.Context, p []byte, off int64) error {
	if err := d.check(ctx, off, int64(len(p)), false); err != nil {
		return fmt.Errorf("memdev read: %w", err)
	}
	d.reads.Add(1)
	span(off, int64(len(p)), func(ci int, in, rel, l int64) {
		c := &d.chunks[ci]
		c.mu.RLock()
		if c.data == nil {
			clear(p[rel : rel+l])
		} else {
			copy(p[rel:rel+l], c.data[in:in+l])
		}
		c.mu.RUnlock()
	})
	return nil
}

func (d *Device) chunkLen(ci int) int64 {
	return min(chunkSize, d.size-int64(ci)*chunkSize)
}

// WriteAt implements block.Device.
func (d *Device) WriteAt(ctx context.Context, p []byte, off int64, flags block.WriteFlags) error {
	if err := d.check(ctx, off, int64(len(p)), true); err != nil {
		return fmt.Errorf("memdev write: %w", err)
	}
	d.writes.Add(1)
	if flags&block.FUA != 0 {
		d.fuaWrites.Add(1)
	}
	span(off, int64(len(p)), func(ci int, in, rel, l int64) {
		c := &d.chunks[ci]
		c.mu.Lock()
		if c.data == nil {
			c.data = make([]byte, d.chunkLen(ci))
		}
		copy(c.data[in:in+l], p[rel:rel+l])
		c.mu.Unlock()
	})
	return nil
}

// Flush implements block.Device. Memory is the stable storage of this device, so a flush only
// counts.
func (d *Device) Flush(ctx context.Context) error {
	if err := d.check(ctx, 0, 0, false); err != nil {
		return fmt.Errorf("memdev flush: %w", err)
	}
	d.flushes.Add(1)
	return nil
}

func (d *Device) zero(off, length int64) {
	span(off, length, func(ci int, in, _, l int64) {
		c := &d.chunks[ci]
		c.mu.Lock()
		if in == 0 && l == d.chunkLen(ci) {
			c.data = nil
		} else if c.data != nil {
			clear(c.data[in : in+l])
		}
		c.mu.Unlock()
	})
}

// Discard implements block.Device; the range reads back as zeroes afterwards.
func (d *Device) Discard(ctx context.Context, off, length int64) error {
	if err := d.check(ctx, off, length, true); err != nil {
		return fmt.Errorf("memdev discard: %w", err)
	}
	if !d.limits.CanDiscard {
		return fmt.Errorf("memdev discard: %w", block.ErrNotSupported)
	}
	d.discards.Add(1)
	d.zero(off, length)
	return nil
}

// WriteZeroes implements block.Device. Zeroing is always fast here (no data moves).
func (d *Device) WriteZeroes(ctx context.Context, off, length int64, flags block.ZeroFlags) error {
	if err := d.check(ctx, off, length, true); err != nil {
		return fmt.Errorf("memdev write zeroes: %w", err)
	}
	if !d.limits.CanWriteZeroes || (flags&block.FastOnly != 0 && !d.limits.CanFastZero) {
		return fmt.Errorf("memdev write zeroes: %w", block.ErrNotSupported)
	}
	d.zeroes.Add(1)
	d.zero(off, length)
	return nil
}

// Close implements block.Device. A second Close returns nil; every other call after Close fails
// with block.ErrClosed.
func (d *Device) Close() error {
	d.closed.Store(true)
	return nil
}

var _ block.Device = (*Device)(nil)
