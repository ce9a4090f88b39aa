package csipool

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/block"
)

// filled is a memdev device of size bytes whose every byte is 0xA5, a pattern a test recognises.
func filled(t *testing.T, size int64, lim *block.Limits) *memdev.Device {
	t.Helper()
	d, err := memdev.New(size, memdev.Options{Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.WriteAt(context.Background(), bytes.Repeat([]byte{0xA5}, int(size)), 0, 0); err != nil {
		t.Fatal(err)
	}
	return d
}

// allZero reads the whole device and fails at its first non-zero byte.
func allZero(t *testing.T, d block.Device) {
	t.Helper()
	buf := make([]byte, d.Size())
	if err := d.ReadAt(context.Background(), buf, 0); err != nil {
		t.Fatal(err)
	}
	if i := firstNonZero(buf); i >= 0 {
		t.Fatalf("byte %d of %d is %#x after the erase", i, len(buf), buf[i])
	}
}

// TestEraseDeviceWriteZeroes: a device with write-zeroes is zeroed by WriteZeroes (in chunks of
// its MaxWriteZeroes), then flushed, and reads back zeroes everywhere.
func TestEraseDeviceWriteZeroes(t *testing.T) {
	lim := block.Limits{MaxTransfer: 1 << 20, MaxWriteZeroes: 1 << 20, CanFlush: true, VolatileCache: true, CanWriteZeroes: true}
	d := filled(t, 5<<20+4096, &lim)
	res, err := EraseDevice(context.Background(), d, "write zeroes")
	if err != nil {
		t.Fatal(err)
	}
	if res.Method != "write zeroes" || res.Bytes != d.Size() {
		t.Errorf("result %+v", res)
	}
	st := d.Stats()
	if st.WriteZeroes != 6 || st.Flushes != 1 || st.Writes != 1 { // the one write is filled's
		t.Errorf("calls %+v; want 6 write-zeroes of at most 1 MiB, then a flush", st)
	}
	allZero(t, d)
}

// TestEraseDeviceWrites: without write-zeroes the device is zeroed by writes of a zero buffer.
func TestEraseDeviceWrites(t *testing.T) {
	lim := block.Limits{MaxTransfer: 256 << 10, CanFlush: true}
	d := filled(t, 3<<20, &lim)
	res, err := EraseDevice(context.Background(), d, "write zeroes")
	if err != nil {
		t.Fatal(err)
	}
	if res.Method != "WRITEs of zeroes" || d.Stats().WriteZeroes != 0 || d.Stats().Writes != 1+12 {
		t.Errorf("result %+v, calls %+v; want 12 writes of 256 KiB", res, d.Stats())
	}
	allZero(t, d)
}

// liar acknowledges write-zeroes and does nothing: a target that drops WRITE SAME.
type liar struct{ *memdev.Device }

func (liar) WriteZeroes(context.Context, int64, int64, block.ZeroFlags) error { return nil }

// TestEraseDeviceVerifies: zeroes that did not happen are caught by the read-back, whose sample
// always includes the first and the last block.
func TestEraseDeviceVerifies(t *testing.T) {
	for _, at := range []int64{0, 4<<20 - 512} {
		d := liar{filled(t, 4<<20, nil)}
		if err := d.Device.WriteZeroes(context.Background(), 0, 4<<20, 0); err != nil {
			t.Fatal(err)
		}
		if err := d.WriteAt(context.Background(), bytes.Repeat([]byte{1}, 512), at, 0); err != nil {
			t.Fatal(err)
		}
		_, err := EraseDevice(context.Background(), d, "write zeroes")
		if err == nil || !strings.Contains(err.Error(), "not zeroes after the erase") {
			t.Fatalf("a block left at %d: %v; want the verification to fail", at, err)
		}
	}
}

// TestEraseDeviceRefuses: a read-only LUN cannot be erased, and a cancelled erase fails.
func TestEraseDeviceRefuses(t *testing.T) {
	d := filled(t, 1<<20, nil)
	ro, err := memdev.New(1<<20, memdev.Options{Limits: &block.Limits{ReadOnly: true}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := EraseDevice(context.Background(), ro, "x"); !errors.Is(err, block.ErrReadOnly) {
		t.Fatalf("read-only: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := EraseDevice(ctx, d, "x"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

// TestZeroMethod: the method logged follows what backend/iser's WriteZeroes does on the LUN.
func TestZeroMethod(t *testing.T) {
	for _, tc := range []struct {
		info iser.Info
		want string
	}{
		{iser.Info{WriteSameUnmap: true, ZeroesAfterUnmap: true, WriteSame: "yes"}, "with UNMAP"},
		{iser.Info{WriteSameUnmap: true, WriteSame: "yes"}, "of a zero block"},
		{iser.Info{UnmapSupported: true, ZeroesAfterUnmap: true, WriteSame: "unknown"}, "of a zero block"},
		{iser.Info{WriteSame: "no"}, "no WRITE SAME"},
	} {
		if got := zeroMethod(tc.info); !strings.Contains(got, tc.want) {
			t.Errorf("%+v: %q, want %q", tc.info, got, tc.want)
		}
	}
}
