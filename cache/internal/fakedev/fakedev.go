// Package fakedev is an in-memory block.Device for testing the cache: it models a disk with its
// own volatile write cache (writes land in a "current" image and become durable at Flush or with
// FUA), keeps a log of every operation, injects faults, and detects two writes to overlapping
// ranges in flight at once (which a correct cache never issues, since their order on a real
// target would be undefined).
package fakedev

import (
	"context"
	"fmt"
	"sync"

	"github.com/iser-blk/iser-blk/block"
)

// Kind names an operation in the log.
type Kind int

// Operation kinds.
const (
	Read Kind = iota
	Write
	Flush
	Discard
	Zero
)

func (k Kind) String() string {
	return [...]string{"read", "write", "flush", "discard", "zero"}[k]
}

// Op is one logged operation.
type Op struct {
	Kind  Kind
	Off   int64
	Len   int64
	FUA   bool
	Err   error
	Start uint64 // global sequence when the call began
	End   uint64 // and when it returned
}

// Dev is the fake device. The zero value is not usable; call New.
type Dev struct {
	lim  block.Limits
	size int64
	bs   int64

	mu       sync.Mutex
	cur      []byte  // what reads see
	durable  []byte  // what survives Crash
	volatile []bool  // per block: cur differs from durable (not yet flushed)
	volList  []int64 // the blocks with volatile set
	log      []Op
	seq      uint64
	inflight map[uint64]Op // writes/discards/zeroes in flight, by Start
	overlaps []string
	fault    func(Op) error
	before   func(Op)
	closed   bool
}

// New returns a zeroed device of size bytes with the given limits (LogicalBlockSize must be set).
func New(size int64, lim block.Limits) *Dev {
	bs := int64(lim.LogicalBlockSize)
	return &Dev{
		lim:      lim,
		size:     size,
		bs:       bs,
		cur:      make([]byte, size),
		durable:  make([]byte, size),
		volatile: make([]bool, size/bs),
		inflight: map[uint64]Op{},
	}
}

// SetFault installs f, called for every operation before it is applied; a non-nil result fails
// the operation without applying it. nil removes the fault.
func (d *Dev) SetFault(f func(Op) error) {
	d.mu.Lock()
	d.fault = f
	d.mu.Unlock()
}

// SetBefore installs a hook run (without the lock) at the start of every operation, e.g. to
// yield and widen race windows.
func (d *Dev) SetBefore(f func(Op)) {
	d.mu.Lock()
	d.before = f
	d.mu.Unlock()
}

// Size implements block.Device.
func (d *Dev) Size() int64 { return d.size }

// BlockSize implements block.Device.
func (d *Dev) BlockSize() int { return int(d.bs) }

// Limits implements block.Device.
func (d *Dev) Limits() block.Limits { return d.lim }

// begin validates and registers an operation; the hook installed by SetBefore then runs while
// the operation counts as in flight, which widens the windows the overlap detector watches.
func (d *Dev) begin(op Op) (Op, error) {
	op, hook, err := d.register(op)
	if err == nil && hook != nil {
		hook(op)
	}
	return op, err
}

func (d *Dev) register(op Op) (Op, func(Op), error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seq++
	op.Start = d.seq
	if d.closed {
		return op, nil, fmt.Errorf("fakedev: %w", block.ErrClosed)
	}
	if op.Kind != Flush {
		if err := block.CheckRange(d, op.Off, op.Len); err != nil {
			return op, nil, err
		}
	}
	if (op.Kind == Read || op.Kind == Write) && d.lim.MaxTransfer > 0 && op.Len > d.lim.MaxTransfer {
		return op, nil, fmt.Errorf("fakedev: %s of %d bytes exceeds MaxTransfer %d: %w", op.Kind, op.Len, d.lim.MaxTransfer, block.ErrInvalid)
	}
	if d.fault != nil {
		if err := d.fault(op); err != nil {
			return op, nil, err
		}
	}
	if op.Kind == Write || op.Kind == Discard || op.Kind == Zero {
		for _, o := range d.inflight {
			if o.Off < op.Off+op.Len && op.Off < o.Off+o.Len {
				d.overlaps = append(d.overlaps, fmt.Sprintf("%s [%d,+%d) issued while %s [%d,+%d) in flight", op.Kind, op.Off, op.Len, o.Kind, o.Off, o.Len))
			}
		}
		d.inflight[op.Start] = op
	}
	return op, d.before, nil
}

func (d *Dev) end(op Op, err error) {
	d.seq++
	op.End = d.seq
	op.Err = err
	delete(d.inflight, op.Start)
	d.log = append(d.log, op)
}

// ReadAt implements block.Device.
func (d *Dev) ReadAt(_ context.Context, p []byte, off int64) error {
	op, err := d.begin(Op{Kind: Read, Off: off, Len: int64(len(p))})
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		copy(p, d.cur[off:])
	}
	d.end(op, err)
	return err
}

// WriteAt implements block.Device.
func (d *Dev) WriteAt(_ context.Context, p []byte, off int64, flags block.WriteFlags) error {
	fua := flags&block.FUA != 0
	if fua && !d.lim.CanFUA {
		return fmt.Errorf("fakedev: FUA not advertised: %w", block.ErrInvalid)
	}
	op, err := d.begin(Op{Kind: Write, Off: off, Len: int64(len(p)), FUA: fua})
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		d.store(off, p, fua)
	}
	d.end(op, err)
	return err
}

func (d *Dev) store(off int64, p []byte, durable bool) {
	copy(d.cur[off:], p)
	for b := off / d.bs; b < (off+int64(len(p)))/d.bs; b++ {
		if durable {
			copy(d.durable[b*d.bs:(b+1)*d.bs], d.cur[b*d.bs:])
			d.volatile[b] = false
		} else if !d.volatile[b] {
			d.volatile[b] = true
			d.volList = append(d.volList, b)
		}
	}
}

// Flush implements block.Device: every block written so far becomes durable.
func (d *Dev) Flush(_ context.Context) error {
	op, err := d.begin(Op{Kind: Flush})
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		for _, b := range d.volList {
			if d.volatile[b] {
				copy(d.durable[b*d.bs:(b+1)*d.bs], d.cur[b*d.bs:])
				d.volatile[b] = false
			}
		}
		d.volList = d.volList[:0]
	}
	d.end(op, err)
	return err
}

// Discard implements block.Device; discarded blocks read back as zeroes.
func (d *Dev) Discard(_ context.Context, off, length int64) error {
	if !d.lim.CanDiscard {
		return fmt.Errorf("fakedev: %w", block.ErrNotSupported)
	}
	op, err := d.begin(Op{Kind: Discard, Off: off, Len: length})
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		d.store(off, make([]byte, length), false)
	}
	d.end(op, err)
	return err
}

// WriteZeroes implements block.Device.
func (d *Dev) WriteZeroes(_ context.Context, off, length int64, flags block.ZeroFlags) error {
	if !d.lim.CanWriteZeroes {
		return fmt.Errorf("fakedev: %w", block.ErrNotSupported)
	}
	op, err := d.begin(Op{Kind: Zero, Off: off, Len: length, FUA: flags&block.ZeroFUA != 0})
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		d.store(off, make([]byte, length), flags&block.ZeroFUA != 0)
	}
	d.end(op, err)
	return err
}

// Close implements block.Device.
func (d *Dev) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	return nil
}

// Reopen makes a closed device usable again (the "restart" after a crash).
func (d *Dev) Reopen() {
	d.mu.Lock()
	d.closed = false
	d.mu.Unlock()
}

// Crash loses everything not yet durable, as a power failure would.
func (d *Dev) Crash() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, b := range d.volList {
		if d.volatile[b] {
			copy(d.cur[b*d.bs:(b+1)*d.bs], d.durable[b*d.bs:])
			d.volatile[b] = false
		}
	}
	d.volList = d.volList[:0]
}

// Durable returns a copy of the durable bytes of [off, off+n).
func (d *Dev) Durable(off, n int64) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]byte(nil), d.durable[off:off+n]...)
}

// Current returns a copy of what a read of [off, off+n) would return.
func (d *Dev) Current(off, n int64) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]byte(nil), d.cur[off:off+n]...)
}

// Log returns a copy of the operation log.
func (d *Dev) Log() []Op {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Op(nil), d.log...)
}

// ResetLog empties the operation log.
func (d *Dev) ResetLog() {
	d.mu.Lock()
	d.log = d.log[:0]
	d.mu.Unlock()
}

// Overlaps lists the overlapping in-flight writes seen so far.
func (d *Dev) Overlaps() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.overlaps...)
}
