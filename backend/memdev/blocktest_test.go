package memdev_test

import (
	"testing"

	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/block/blocktest"
)

// TestConformance runs the block.Device conformance suite against memdev with everything
// advertised, with nothing optional advertised, read-only, and with 4 KiB blocks.
func TestConformance(t *testing.T) {
	for _, url := range []string{
		"mem://16MiB",
		"mem://16MiB?nodiscard=1&nozero=1&noflush=1&nomulticonn=1",
		"mem://16MiB?ro=1",
		"mem://16MiB?bs=4096&maxtransfer=64KiB",
	} {
		t.Run(url, func(t *testing.T) {
			blocktest.Run(t, func(t *testing.T) block.Device {
				d, err := memdev.ParseURL(url)
				if err != nil {
					t.Fatal(err)
				}
				return d
			})
		})
	}
}
