package iser

import (
	"errors"
	"testing"

	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
)

// TestDeriveLimits: what the probe learnt becomes the Device's limits, case by case, without a
// target: caps on one command, alignment, the UNMAP/WRITE SAME rules of SBC-4 §6.6.4 and the
// safe assumptions for what a target did not answer.
func TestDeriveLimits(t *testing.T) {
	disk := func(f func(*probeReport)) probeReport {
		r := probeReport{capacity: scsi.Capacity{LastLBA: 1<<21 - 1, BlockSize: 512}, use16: true, writeSame: wsUnknown}
		if f != nil {
			f(&r)
		}
		return r
	}
	tests := []struct {
		name     string
		rep      probeReport
		capBytes int64
		readOnly bool
		check    func(t *testing.T, d derivedLimits)
		wantErr  error
	}{
		{"nothing reported: defaults and safe assumptions", disk(nil), 0, false, func(t *testing.T, d derivedLimits) {
			l := d.limits
			if l.MaxTransfer != defaultMaxTransfer || !l.VolatileCache || l.CanFUA || l.CanDiscard || !l.CanFastZero ||
				l.MaxWriteZeroes != defaultMaxWriteSameBlocks<<9 || l.ReadOnly || !l.CanFlush || !l.MultiConn {
				t.Errorf("%+v", l)
			}
		}, nil},
		{"no 16-byte CDBs: 0xFFFF blocks", disk(func(r *probeReport) { r.use16 = false; r.blockLimits.MaxTransferLength = 1 << 20 }), 0, false,
			func(t *testing.T, d derivedLimits) {
				if d.maxXferBlocks != 0xFFFF {
					t.Errorf("maxXferBlocks %d", d.maxXferBlocks)
				}
			}, nil},
		{"a backstore's 2 TiB limit is capped", disk(func(r *probeReport) { r.blockLimits.MaxTransferLength = 1<<32 - 1 }), 0, false,
			func(t *testing.T, d derivedLimits) {
				if d.limits.MaxTransfer != maxSaneTransfer {
					t.Errorf("MaxTransfer %d", d.limits.MaxTransfer)
				}
			}, nil},
		{"transport cap (iSER 512 KiB)", disk(nil), 512 << 10, false, func(t *testing.T, d derivedLimits) {
			if d.maxXferBlocks != 1024 || d.limits.MaxTransfer != 512<<10 {
				t.Errorf("maxXferBlocks %d MaxTransfer %d", d.maxXferBlocks, d.limits.MaxTransfer)
			}
		}, nil},
		{"aligned down to physical blocks", disk(func(r *probeReport) { r.capacity.PhysBlockExponent = 3 }), 512 * 1001, false,
			func(t *testing.T, d derivedLimits) {
				if d.maxXferBlocks != 1000 || d.limits.PhysicalBlockSize != 4096 {
					t.Errorf("maxXferBlocks %d physical %d", d.maxXferBlocks, d.limits.PhysicalBlockSize)
				}
			}, nil},
		{"cap below a block", disk(func(r *probeReport) { r.capacity.BlockSize = 4096 }), 2048, false, nil, block.ErrInvalid},
		{"4 KiB blocks", disk(func(r *probeReport) { r.capacity.BlockSize = 4096 }), 0, false, func(t *testing.T, d derivedLimits) {
			if d.shift != 12 || d.maxXferBlocks != defaultMaxTransfer>>12 || d.limits.LogicalBlockSize != 4096 {
				t.Errorf("shift %d maxXferBlocks %d", d.shift, d.maxXferBlocks)
			}
		}, nil},
		{"UNMAP with limits", disk(func(r *probeReport) {
			r.haveLBP, r.lbp = true, scsi.LogicalBlockProvisioning{LBPU: true, LBPRZ: 1}
			r.blockLimits = scsi.BlockLimits{Length: 0x3C, MaxUnmapLBACount: 8192, MaxUnmapDescriptorCount: 1, OptimalUnmapGranularity: 8}
		}), 0, false, func(t *testing.T, d derivedLimits) {
			l := d.limits
			if !d.lbpu || d.lbpws || !l.CanDiscard || l.MaxDiscard != 8192<<9 || l.DiscardAlignment != 4096 || !l.DiscardZeroes {
				t.Errorf("%+v %+v", d, l)
			}
		}, nil},
		{"UNMAP limits zero: LBPU ignored, WRITE SAME unmap used", disk(func(r *probeReport) {
			r.haveLBP, r.lbp = true, scsi.LogicalBlockProvisioning{LBPU: true, LBPWS: true}
			r.blockLimits = scsi.BlockLimits{Length: 0x3C, MaxWriteSameLength: 4096}
		}), 0, false, func(t *testing.T, d derivedLimits) {
			l := d.limits
			if d.lbpu || !d.lbpws || !l.CanDiscard || d.maxUnmapBlocks != 4096 || l.MaxWriteZeroes != 4096<<9 || l.DiscardZeroes {
				t.Errorf("%+v %+v", d, l)
			}
		}, nil},
		{"no write cache, FUA, write-protected", disk(func(r *probeReport) {
			r.mode, r.modeOK = scsi.ModeSense{CachingPage: true, WCE: false, DPOFUA: true, WriteProtect: true}, true
		}), 0, false, func(t *testing.T, d derivedLimits) {
			l := d.limits
			if l.VolatileCache || !l.CanFUA || !l.ReadOnly {
				t.Errorf("%+v", l)
			}
		}, nil},
		{"caching page missing: volatile", disk(func(r *probeReport) { r.mode, r.modeOK = scsi.ModeSense{}, true }), 0, true,
			func(t *testing.T, d derivedLimits) {
				if !d.volatile || !d.limits.ReadOnly {
					t.Errorf("%+v", d)
				}
			}, nil},
		{"no WRITE SAME: zeroes are written", disk(func(r *probeReport) { r.writeSame = wsNo; r.rotational = true }), 0, false,
			func(t *testing.T, d derivedLimits) {
				l := d.limits
				if l.CanFastZero || l.MaxWriteZeroes != l.MaxTransfer || !l.CanWriteZeroes || !l.Rotational {
					t.Errorf("%+v", l)
				}
			}, nil},
		{"optimal transfer clamped", disk(func(r *probeReport) { r.blockLimits.OptimalTransferLength = 1 << 30 }), 0, false,
			func(t *testing.T, d derivedLimits) {
				if d.limits.OptimalTransfer != d.limits.MaxTransfer {
					t.Errorf("optimal %d max %d", d.limits.OptimalTransfer, d.limits.MaxTransfer)
				}
			}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := deriveLimits(tt.rep, tt.capBytes, tt.readOnly)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, d)
		})
	}
}
