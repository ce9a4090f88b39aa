package cache_test

import (
	"context"
	"fmt"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache"
	"github.com/iser-blk/iser-blk/cache/internal/fakedev"
)

// The CLI turns --cache, --cache-size and --cache-dirty into a Config and wraps the backend.
func Example() {
	backend := fakedev.New(64<<20, block.Limits{LogicalBlockSize: 512, MaxTransfer: 1 << 20, CanFlush: true, CanFUA: true})
	cfg, err := cache.ParseConfig("writeback", "16MiB", "25%")
	if err != nil {
		panic(err)
	}
	dev, err := cache.Wrap(backend, cfg, nil)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	_ = dev.WriteAt(ctx, make([]byte, 4096), 0, 0) // acknowledged from cache
	fmt.Println("dirty:", dev.(*cache.Cache).DirtyBytes())
	_ = dev.Flush(ctx) // now on the backend, and the backend flushed
	fmt.Println("dirty after flush:", dev.(*cache.Cache).DirtyBytes())
	fmt.Println("close:", dev.Close())
	// Output:
	// dirty: 4096
	// dirty after flush: 0
	// close: <nil>
}
