package cache_test

import (
	"path/filepath"
	"testing"

	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/block/blocktest"
	"github.com/iser-blk/iser-blk/cache"
	"github.com/iser-blk/iser-blk/cache/journal"
)

// TestConformance runs the block.Device conformance suite against the cache in every mode over
// memdev: a 4 MiB cache in front of a 16 MiB device, so that the suite also evicts pages; and
// over a backend that has neither discard nor write-zeroes (the cache then emulates zeroing).
func TestConformance(t *testing.T) {
	for _, mode := range []cache.Mode{cache.WriteBack, cache.WriteThrough, cache.Off} {
		for _, url := range []string{"mem://16MiB", "mem://16MiB?nodiscard=1&nozero=1&maxtransfer=256KiB"} {
			t.Run(mode.String()+"/"+url, func(t *testing.T) {
				blocktest.Run(t, func(t *testing.T) block.Device {
					be, err := memdev.ParseURL(url)
					if err != nil {
						t.Fatal(err)
					}
					d, err := cache.Wrap(be, cache.Config{Mode: mode, Size: 4 << 20}, nil)
					if err != nil {
						t.Fatal(err)
					}
					return d
				})
			})
		}
	}
}

// TestConformanceCacheDev runs the suite against the stack --cache-dev builds: the RAM cache,
// write-through, on a journal whose log is a file, on memdev (with and without discard and
// write-zeroes, so that the journal's refusals and the cache's emulation are both met).
func TestConformanceCacheDev(t *testing.T) {
	for _, url := range []string{"mem://16MiB", "mem://16MiB?nodiscard=1&nozero=1&maxtransfer=256KiB"} {
		t.Run(url, func(t *testing.T) {
			blocktest.Run(t, func(t *testing.T) block.Device {
				be, err := memdev.ParseURL(url)
				if err != nil {
					t.Fatal(err)
				}
				j, err := journal.OpenPath(filepath.Join(t.TempDir(), "cache.dev"), journal.MinSize+journal.LogStart, be,
					journal.Identity{URL: url}, journal.Options{})
				if err != nil {
					t.Fatal(err)
				}
				d, err := cache.Wrap(j, cache.Config{Mode: cache.WriteThrough, Size: 4 << 20}, nil)
				if err != nil {
					t.Fatal(err)
				}
				return d
			})
		})
	}
}
