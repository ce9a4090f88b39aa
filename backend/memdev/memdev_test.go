package memdev

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/iser-blk/iser-blk/block"
)

func TestParseURL(t *testing.T) {
	cases := []struct {
		url     string
		size    int64
		bs      int
		check   func(block.Limits) bool
		wantErr bool
	}{
		{"mem://256MiB", 256 << 20, 512, func(l block.Limits) bool { return l.CanFlush && l.CanDiscard && l.MultiConn }, false},
		{"mem://1G?bs=4096", int64(1e9) / 4096 * 4096, 4096, func(l block.Limits) bool { return l.LogicalBlockSize == 4096 }, false},
		{"mem://1MiB?ro=1", 1 << 20, 512, func(l block.Limits) bool { return l.ReadOnly && !l.CanDiscard }, false},
		{"mem://1MiB?noflush=1&nomulticonn=1", 1 << 20, 512, func(l block.Limits) bool { return !l.CanFlush && !l.MultiConn }, false},
		{"mem://1MiB?maxtransfer=64KiB", 1 << 20, 512, func(l block.Limits) bool { return l.MaxTransfer == 64<<10 }, false},
		{"mem://0", 0, 0, nil, true},
		{"mem://lots", 0, 0, nil, true},
		{"mem://1MiB?bs=1000", 0, 0, nil, true},
		{"file:///x", 0, 0, nil, true},
	}
	for _, tc := range cases {
		d, err := ParseURL(tc.url)
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: err %v", tc.url, err)
			continue
		}
		if err != nil {
			if !errors.Is(err, block.ErrInvalid) {
				t.Errorf("%s: error %v does not wrap ErrInvalid", tc.url, err)
			}
			continue
		}
		if d.Size() != tc.size || d.BlockSize() != tc.bs || !tc.check(d.Limits()) {
			t.Errorf("%s: size %d bs %d limits %+v", tc.url, d.Size(), d.BlockSize(), d.Limits())
		}
	}
}

func TestReadWriteDiscardZero(t *testing.T) {
	ctx := context.Background()
	d, err := New(3<<20+4096, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// A write spanning a chunk boundary reads back; untouched space reads as zeroes.
	data := bytes.Repeat([]byte{7}, 8192)
	if err := d.WriteAt(ctx, data, 1<<20-4096, block.FUA); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 16384)
	if err := d.ReadAt(ctx, got, 1<<20-8192); err != nil {
		t.Fatal(err)
	}
	want := append(append(make([]byte, 4096), data...), make([]byte, 4096)...)
	if !bytes.Equal(got, want) {
		t.Fatal("read back differs")
	}
	if err := d.Discard(ctx, 0, 2<<20); err != nil {
		t.Fatal(err)
	}
	if err := d.ReadAt(ctx, got, 1<<20-8192); err != nil || !bytes.Equal(got, make([]byte, 16384)) {
		t.Fatal("discarded range does not read as zeroes")
	}
	if err := d.WriteAt(ctx, data, 3<<20-4096, 0); err != nil { // the short last chunk
		t.Fatal(err)
	}
	if err := d.WriteZeroes(ctx, 3<<20, 4096, block.NoHole); err != nil {
		t.Fatal(err)
	}
	st := d.Stats()
	if st.Writes != 2 || st.FUAWrites != 1 || st.Discards != 1 || st.WriteZeroes != 1 || st.Reads != 2 {
		t.Errorf("stats %+v", st)
	}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"past the end", d.ReadAt(ctx, got, 3<<20), block.ErrInvalid},
		{"misaligned", d.WriteAt(ctx, got[:100], 0, 0), block.ErrInvalid},
		{"negative", d.Discard(ctx, -512, 512), block.ErrInvalid},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	ro, _ := ParseURL("mem://1MiB?ro=1")
	if err := ro.WriteAt(ctx, data, 0, 0); !errors.Is(err, block.ErrReadOnly) {
		t.Errorf("read-only write: %v", err)
	}
	nz, _ := ParseURL("mem://1MiB?nozero=1")
	if err := nz.WriteZeroes(ctx, 0, 4096, 0); !errors.Is(err, block.ErrNotSupported) {
		t.Errorf("write zeroes without support: %v", err)
	}
	d.Close()
	if err := d.Flush(ctx); !errors.Is(err, block.ErrClosed) {
		t.Errorf("flush after close: %v", err)
	}
}

func TestConcurrentAccess(t *testing.T) {
	ctx := context.Background()
	d, err := New(8<<20, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := bytes.Repeat([]byte{byte(g)}, 64<<10)
			got := make([]byte, 64<<10)
			for i := range 50 {
				off := int64((g*50+i)%128) * (64 << 10)
				if err := d.WriteAt(ctx, buf, off, 0); err != nil {
					t.Error(err)
				}
				if err := d.ReadAt(ctx, got, off); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
}
