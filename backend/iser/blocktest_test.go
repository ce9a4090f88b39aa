package iser

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/iser-blk/iser-blk/backend/iser/iscsitest"
	"github.com/iser-blk/iser-blk/backend/iser/scsi/scsitest"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/block/blocktest"
)

// TestConformance runs the block.Device conformance suite against the iSCSI device over a real
// session (iSCSI/TCP to the in-process fake target), one target per subtest, for LUNs that
// exercise each path the device chooses: a plain 512-byte LUN (WRITE SAME zeroing, emulated
// FUA), a 4 KiB thin LUN with a volatile cache, native FUA, UNMAP and a small transfer limit
// (split requests), a legacy LUN with only 10-byte commands and no WRITE SAME (zeroing written
// out), and a read-only LUN.
func TestConformance(t *testing.T) {
	luns := []struct {
		name string
		cfg  scsitest.Config
	}{
		{"512", scsitest.Config{Blocks: 32768}},
		{"4k-thin", scsitest.Config{BlockSize: 4096, Blocks: 4096, Thin: true, LBPU: true, LBPWS: true, LBPRZ: true,
			DPOFUA: true, WCE: true, MaxTransferBlocks: 16, MaxUnmapLBACount: 1024, UnmapGranularity: 1}},
		{"legacy", scsitest.Config{Blocks: 32768, No16ByteRW: true, NoReadCapacity16: true, NoWriteSame: true, NoRSOC: true, WCE: true}},
		{"read-only", scsitest.Config{Blocks: 32768, ReadOnly: true}},
	}
	for _, l := range luns {
		t.Run(l.name, func(t *testing.T) {
			blocktest.Run(t, func(t *testing.T) block.Device {
				return openFake(t, l.cfg)
			})
		})
	}
}

// openFake starts a fake target serving a LUN built from cfg and opens a Device on it; the
// target stops with the test (after the suite's Close of the device).
func openFake(t *testing.T, cfg scsitest.Config) *Device {
	t.Helper()
	tg, err := iscsitest.Start(scsitest.New(cfg), iscsitest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := Open(ctx, tg.URL(0), Options{InitiatorName: "iqn.2026-11.io.iser-blk:unit", Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatalf("Open %s: %v", tg.URL(0), err)
	}
	return d
}
