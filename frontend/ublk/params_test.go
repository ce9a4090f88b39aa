package ublk

import (
	"errors"
	"testing"

	"github.com/iser-blk/iser-blk/block"
)

func TestMaxIOFor(t *testing.T) {
	cases := []struct {
		name string
		lim  block.Limits
		want int
		got  int
	}{
		{"default cap", block.Limits{LogicalBlockSize: 512, MaxTransfer: 32 << 20}, 0, defaultMaxIO},
		{"device smaller", block.Limits{LogicalBlockSize: 512, MaxTransfer: 128 << 10}, 0, 128 << 10},
		{"asked bigger than driver", block.Limits{LogicalBlockSize: 512}, 64 << 20, maxIOBufBytes},
		{"rounded to a page", block.Limits{LogicalBlockSize: 512, MaxTransfer: 70000}, 0, 69632},
		{"no device limit", block.Limits{LogicalBlockSize: 4096}, 1 << 20, 1 << 20},
	}
	for _, c := range cases {
		if got := maxIOFor(c.lim, c.want); got != c.got {
			t.Errorf("%s: maxIOFor = %d, want %d", c.name, got, c.got)
		}
	}
}

func TestBuildParams(t *testing.T) {
	full := block.Limits{
		LogicalBlockSize: 512, PhysicalBlockSize: 4096, OptimalTransfer: 64 << 10,
		VolatileCache: true, CanFlush: true, CanFUA: true, CanDiscard: true, CanWriteZeroes: true,
		MaxDiscard: 1 << 30, MaxWriteZeroes: 8 << 20, DiscardAlignment: 4096, Rotational: true,
	}
	p, err := buildParams(1<<30, full, 512<<10)
	if err != nil {
		t.Fatal(err)
	}
	b, d := p.Basic, p.Discard
	checks := []struct {
		name      string
		got, want uint64
	}{
		{"types", uint64(p.Types), paramTypeBasic | paramTypeDiscard},
		{"attrs", uint64(b.Attrs), attrVolatileCache | attrFUA | attrRotational},
		{"logical_bs_shift", uint64(b.LogicalBSShift), 9},
		{"physical_bs_shift", uint64(b.PhysicalBSShift), 12},
		{"io_min_shift", uint64(b.IOMinShift), 12},
		{"io_opt_shift", uint64(b.IOOptShift), 16},
		{"max_sectors", uint64(b.MaxSectors), 1024},
		{"dev_sectors", b.DevSectors, 1 << 21},
		{"discard_granularity", uint64(d.DiscardGranularity), 4096},
		{"max_discard_sectors", uint64(d.MaxDiscardSectors), 1 << 21},
		{"max_discard_segments", uint64(d.MaxDiscardSegments), 1},
		{"max_write_zeroes_sectors", uint64(d.MaxWriteZeroesSectors), 1 << 14},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}

	// A write-through, read-only device: no cache attributes, no discard parameters.
	ro := block.Limits{LogicalBlockSize: 4096, ReadOnly: true, CanDiscard: true, CanFUA: true}
	p, err = buildParams(1<<20, ro, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if p.Basic.Attrs != attrReadOnly || p.Types != paramTypeBasic || p.Basic.LogicalBSShift != 12 || p.Basic.PhysicalBSShift != 12 {
		t.Errorf("read-only params = %+v", p)
	}

	// Write-zeroes only: granularity still set (the driver requires it), no discard sectors.
	wz := block.Limits{LogicalBlockSize: 512, CanWriteZeroes: true}
	p, _ = buildParams(1<<20, wz, 4096)
	if p.Discard.MaxDiscardSectors != 0 || p.Discard.DiscardGranularity != 512 || p.Discard.MaxWriteZeroesSectors == 0 {
		t.Errorf("write-zeroes-only discard params = %+v", p.Discard)
	}
	// Volatile cache without native FUA: no FUA attribute (the kernel emulates it with flushes).
	p, _ = buildParams(1<<20, block.Limits{LogicalBlockSize: 512, VolatileCache: true}, 4096)
	if p.Basic.Attrs != attrVolatileCache {
		t.Errorf("attrs = %#x, want volatile cache only", p.Basic.Attrs)
	}
}

func TestBuildParamsRejects(t *testing.T) {
	cases := []struct {
		name  string
		size  int64
		lim   block.Limits
		maxIO int
	}{
		{"block size 256", 1 << 20, block.Limits{LogicalBlockSize: 256}, 4096},
		{"block size 8192", 1 << 20, block.Limits{LogicalBlockSize: 8192}, 8192},
		{"block size 3000", 1 << 20, block.Limits{LogicalBlockSize: 3000}, 4096},
		{"physical not power of two", 1 << 20, block.Limits{LogicalBlockSize: 512, PhysicalBlockSize: 1536}, 4096},
		{"zero size", 0, block.Limits{LogicalBlockSize: 512}, 4096},
		{"size not multiple", 1000, block.Limits{LogicalBlockSize: 512}, 4096},
		{"max io below block", 1 << 20, block.Limits{LogicalBlockSize: 4096}, 0},
	}
	for _, c := range cases {
		if _, err := buildParams(c.size, c.lim, c.maxIO); !errors.Is(err, block.ErrInvalid) || errors.Is(err, ErrBadOptions) {
			t.Errorf("%s: err = %v, want ErrInvalid (the LUN's, not ErrBadOptions)", c.name, err)
		}
	}
}

func TestCapSectors(t *testing.T) {
	if got := capSectors(0, 512); got != ^uint32(0) {
		t.Errorf("no limit: %d", got)
	}
	if got := capSectors(1<<20+100, 4096); got != 2048 {
		t.Errorf("1 MiB+100 at 4 KiB: %d", got)
	}
	if got := capSectors(1<<50, 4096); got != (^uint32(0))&^7 {
		t.Errorf("huge limit: %#x", got)
	}
}
