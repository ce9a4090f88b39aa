//go:build e2e

package iser

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/block/blocktest"
	"github.com/iser-blk/iser-blk/test/e2e/tgtd"
)

// TestE2EConformance runs the block.Device conformance suite against the iSCSI device on a real
// target: tgtd, with a 512-byte LUN, a 4 KiB LUN and a read-only one (tgtadm readonly=1: MODE
// SENSE WP, writes refused with DATA PROTECT). Every subtest logs in anew to the same LUN; the
// suite never assumes what an earlier subtest left there.
func TestE2EConformance(t *testing.T) {
	tg := tgtd.Start(t, tgtd.Options{Size: 16 << 20})
	addLUN(t, tg, 2, 16<<20, 4096)
	addLUN(t, tg, 3, 16<<20, 512)
	if _, err := tg.TGTAdm("--mode", "logicalunit", "--op", "update", "--tid", strconv.Itoa(tg.TID), "--lun", "3",
		"--params", "readonly=1"); err != nil {
		t.Fatal(err)
	}
	for _, lun := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("lun%d", lun), func(t *testing.T) {
			url := fmt.Sprintf("iscsi://%s/%s/%d", tg.Portal, tg.Name, lun)
			blocktest.Run(t, func(t *testing.T) block.Device {
				return openE2E(t, url, Options{})
			})
		})
	}
}
