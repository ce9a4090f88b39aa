package ublk

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/block"
)

// recDevice is a block.Device that records calls and returns a configured error.
type recDevice struct {
	size int64
	err  error

	mu    sync.Mutex
	calls []string
	data  []byte
}

func (d *recDevice) Size() int64    { return d.size }
func (d *recDevice) BlockSize() int { return 512 }
func (d *recDevice) Limits() block.Limits {
	return block.Limits{LogicalBlockSize: 512, PhysicalBlockSize: 512, VolatileCache: true, CanFlush: true, CanFUA: true, CanDiscard: true, CanWriteZeroes: true}
}
func (d *recDevice) rec(s string, off, n int64) error {
	if err := block.CheckRange(d, off, n); err != nil {
		return err
	}
	d.mu.Lock()
	d.calls = append(d.calls, s)
	d.mu.Unlock()
	return d.err
}
func (d *recDevice) ReadAt(_ context.Context, p []byte, off int64) error {
	if err := d.rec(fmt.Sprintf("read %d+%d", off, len(p)), off, int64(len(p))); err != nil {
		return err
	}
	copy(p, d.data[off:])
	return nil
}
func (d *recDevice) WriteAt(_ context.Context, p []byte, off int64, f block.WriteFlags) error {
	if err := d.rec(fmt.Sprintf("write %d+%d fua=%v", off, len(p), f&block.FUA != 0), off, int64(len(p))); err != nil {
		return err
	}
	copy(d.data[off:], p)
	return nil
}
func (d *recDevice) Flush(context.Context) error { return d.rec("flush", 0, 0) }
func (d *recDevice) Discard(_ context.Context, off, n int64) error {
	return d.rec(fmt.Sprintf("discard %d+%d", off, n), off, n)
}
func (d *recDevice) WriteZeroes(_ context.Context, off, n int64, f block.ZeroFlags) error {
	return d.rec(fmt.Sprintf("zero %d+%d nohole=%v fua=%v", off, n, f&block.NoHole != 0, f&block.ZeroFUA != 0), off, n)
}
func (d *recDevice) Close() error { return nil }

func newServeFixture(err error) (*Server, *recDevice, *tag) {
	dev := &recDevice{size: 1 << 20, err: err, data: make([]byte, 1<<20)}
	s := &Server{dev: dev, log: zap.NewNop(), reqLog: zap.NewNop(), ioCtx: context.Background()}
	return s, dev, &tag{buf: make([]byte, 64<<10)}
}

func TestServe(t *testing.T) {
	cases := []struct {
		name    string
		opFlags uint32
		sectors uint32
		start   uint64
		want    int32
		call    string
	}{
		{"read", opRead, 8, 2, 4096, "read 1024+4096"},
		{"write", opWrite, 16, 0, 8192, "write 0+8192 fua=false"},
		{"write fua", opWrite | ioFFUA, 1, 1, 512, "write 512+512 fua=true"},
		{"flush", opFlush, 0, 0, 0, "flush"},
		{"discard", opDiscard, 2048, 0, 0, "discard 0+1048576"},
		{"write zeroes unmap", opWriteZeroes, 8, 8, 0, "zero 4096+4096 nohole=false fua=false"},
		{"write zeroes nounmap", opWriteZeroes | ioFNoUnmap, 8, 8, 0, "zero 4096+4096 nohole=true fua=false"},
		{"write same unsupported", opWriteSame, 8, 0, -int32(unix.EOPNOTSUPP), ""},
		{"zone op unsupported", 10, 0, 0, -int32(unix.EOPNOTSUPP), ""},
		{"read larger than buffer", opRead, 129, 0, -int32(unix.EINVAL), ""},
		{"empty read", opRead, 0, 0, -int32(unix.EINVAL), ""},
		{"read past end", opRead, 8, 2048, -int32(unix.EINVAL), ""},
		{"discard past end", opDiscard, 8, 2045, -int32(unix.EINVAL), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, dev, tg := newServeFixture(nil)
			tg.opFlags, tg.nrSectors, tg.startSector = c.opFlags, c.sectors, c.start
			if got := s.serve(tg); got != c.want {
				t.Fatalf("result = %d, want %d", got, c.want)
			}
			if c.call == "" {
				if len(dev.calls) != 0 {
					t.Fatalf("device called: %v", dev.calls)
				}
				return
			}
			if len(dev.calls) != 1 || dev.calls[0] != c.call {
				t.Fatalf("device calls = %v, want [%s]", dev.calls, c.call)
			}
		})
	}
}

func TestServeData(t *testing.T) {
	s, dev, tg := newServeFixture(nil)
	for i := range tg.buf {
		tg.buf[i] = byte(i * 7)
	}
	tg.opFlags, tg.nrSectors, tg.startSector = opWrite, 16, 4
	if got := s.serve(tg); got != 8192 {
		t.Fatalf("write = %d", got)
	}
	clear(tg.buf)
	tg.opFlags = opRead
	if got := s.serve(tg); got != 8192 {
		t.Fatalf("read = %d", got)
	}
	for i := 0; i < 8192; i++ {
		if tg.buf[i] != byte(i*7) || dev.data[2048+i] != byte(i*7) {
			t.Fatalf("byte %d differs", i)
		}
	}
}

func TestServeErrors(t *testing.T) {
	cases := []struct {
		err  error
		want unix.Errno
	}{
		{block.ErrIO, unix.EIO},
		{fmt.Errorf("wrapped: %w", block.ErrReadOnly), unix.EROFS},
		{block.ErrNoSpace, unix.ENOSPC},
		{block.ErrNotSupported, unix.EOPNOTSUPP},
		{block.ErrTimeout, unix.EIO}, // block.Errno: a timed-out request failed, EIO
		{block.ErrMedium, unix.EIO},
		{context.Canceled, unix.EIO},
		{errors.New("anything else"), unix.EIO},
	}
	for _, c := range cases {
		s, _, tg := newServeFixture(c.err)
		tg.opFlags, tg.nrSectors = opWrite, 1
		if got := s.serve(tg); got != -int32(c.want) {
			t.Errorf("%v: result %d, want -%d (%v)", c.err, got, c.want, c.want)
		}
	}
}

// FuzzServe feeds arbitrary request descriptors (what the driver writes into the shared
// ublksrv_io_desc array) to serve: it must never panic, never call the device out of range, and
// return either a negative errno or exactly the request's byte count (0 for non-data ops).
func FuzzServe(f *testing.F) {
	f.Add(uint32(opRead), uint32(8), uint64(0))
	f.Add(uint32(opWrite|ioFFUA), uint32(128), uint64(100))
	f.Add(uint32(opDiscard), uint32(0xffffffff), uint64(1<<62))
	f.Add(uint32(opWriteZeroes|ioFNoUnmap), uint32(1), uint64(2047))
	f.Add(uint32(0xff), uint32(0), uint64(0))
	f.Fuzz(func(t *testing.T, opFlags, sectors uint32, start uint64) {
		s, _, tg := newServeFixture(nil)
		tg.opFlags, tg.nrSectors, tg.startSector = opFlags, sectors, start
		res := s.serve(tg)
		op := uint8(opFlags)
		switch {
		case res < 0:
		case op == opRead || op == opWrite:
			if int64(res) != int64(sectors)<<9 {
				t.Fatalf("data op result %d for %d sectors", res, sectors)
			}
		case res != 0:
			t.Fatalf("non-data op %d result %d", op, res)
		}
	})
}

// BenchmarkServeRead shows the per-request path allocates nothing.
func BenchmarkServeRead(b *testing.B) {
	s, _, tg := newServeFixture(nil)
	s.dev = &nopDevice{}
	tg.opFlags, tg.nrSectors = opRead, 8
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if s.serve(tg) != 4096 {
			b.Fatal("serve failed")
		}
	}
}

type nopDevice struct{ recDevice }

func (*nopDevice) Size() int64                                 { return 1 << 30 }
func (*nopDevice) ReadAt(context.Context, []byte, int64) error { return nil }
func (*nopDevice) Flush(context.Context) error                 { return nil }

// TestStartWithoutUblk: no control device (and modprobe cannot provide one) is ErrNoKernel with
// a hint to use --nbd, before anything else happens.
func TestStartWithoutUblk(t *testing.T) {
	dev := &recDevice{size: 1 << 20, data: make([]byte, 1<<20)}
	_, err := Start(context.Background(), dev, Options{ControlPath: "/nonexistent/ublk-control", Queues: 1, Depth: 4})
	if !errors.Is(err, ErrNoKernel) {
		t.Fatalf("err = %v, want ErrNoKernel", err)
	}
	if !strings.Contains(err.Error(), "--nbd") {
		t.Fatalf("error does not suggest --nbd: %v", err)
	}
	if len(dev.calls) != 0 {
		t.Fatalf("device used: %v", dev.calls)
	}
}

func TestStartRejectsBadOptions(t *testing.T) {
	dev := &recDevice{size: 1 << 20, data: make([]byte, 1<<20)}
	tooHigh := uint32(MaxID + 1)
	for _, o := range []Options{{Depth: maxQueueDepth + 1}, {Queues: maxQueues + 1}, {ID: &tooHigh}, {MaxIO: 2048, ControlPath: "/nonexistent"}} {
		_, err := Start(context.Background(), dev, o)
		if !errors.Is(err, ErrBadOptions) || !errors.Is(err, block.ErrInvalid) {
			t.Errorf("%+v: err = %v, want ErrBadOptions (and ErrInvalid)", o, err)
		}
	}
	// A LUN the driver cannot describe is invalid, but no option of ours mends it.
	odd := &recDevice{size: 1000, data: make([]byte, 1000)}
	_, err := Start(context.Background(), odd, Options{ControlPath: "/nonexistent"})
	if !errors.Is(err, block.ErrInvalid) || errors.Is(err, ErrBadOptions) {
		t.Errorf("size 1000: err = %v, want ErrInvalid without ErrBadOptions, before touching the kernel", err)
	}
}
