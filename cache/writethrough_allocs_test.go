package cache

import (
	"path/filepath"
	"testing"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache/internal/fakedev"
	"github.com/iser-blk/iser-blk/cache/journal"
)

// The write path --cache-dev takes on the frontend's goroutine (WriteCached, write-through onto
// the log) allocates nothing per write: pages, the job, the batch header and its iovec are all
// reused.
func TestWriteCachedThroughAllocatesNothing(t *testing.T) {
	be := fakedev.New(16<<20, block.Limits{LogicalBlockSize: 512, PhysicalBlockSize: 512, MaxTransfer: 1 << 20,
		VolatileCache: true, CanFlush: true})
	j, err := journal.OpenPath(filepath.Join(t.TempDir(), "cache.dev"), 64<<20, be, journal.Identity{URL: "mem://16MiB"}, journal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	d, err := Wrap(j, Config{Mode: WriteThrough, Size: 4 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c := d.(*Cache)
	p := make([]byte, 4096)
	i := int64(0)
	if n := allocsPerCall(t, 200, func() {
		if !c.WriteCached(p, (i%64)*4096) {
			t.Fatal("WriteCached declined a 4 KiB write")
		}
		i++
	}); n != 0 {
		t.Fatalf("%v allocations per WriteCached", n)
	}
}
