package cache_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache"
	"github.com/iser-blk/iser-blk/cache/internal/fakedev"
	"github.com/iser-blk/iser-blk/cache/journal"
)

// The stack --cache-dev builds takes a write on the caller's goroutine (WriteCached) when the log
// can take it without waiting: the write is then in the log, not on the target, and no page is
// left dirty; what the log declines (part of a 4 KiB unit) is declined whole and WriteAt does it.
// Concurrent writers trying WriteCached first, as the NBD frontend does, end with the target
// equal to a byte model after detach.
func TestWriteCachedThrough(t *testing.T) {
	ctx := context.Background()
	const size = 16 << 20
	be := fakedev.New(size, block.Limits{LogicalBlockSize: 512, PhysicalBlockSize: 512, MaxTransfer: 1 << 20,
		VolatileCache: true, CanFlush: true, CanFUA: true})
	path := filepath.Join(t.TempDir(), "cache.dev")
	j, err := journal.OpenPath(path, journal.MinSize+journal.LogStart, be, journal.Identity{URL: "mem://16MiB"}, journal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cache.Wrap(j, cache.Config{Mode: cache.WriteThrough, Size: 4 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cw := c.(block.CachedWriter)
	p := bytes.Repeat([]byte{7}, 8192)
	if !cw.WriteCached(p, 1<<20) {
		t.Fatal("WriteCached declined two whole 4 KiB units")
	}
	if s := j.Stats(); s.DirtyBytes != 8192 {
		t.Fatalf("the log holds %d dirty bytes after WriteCached, want 8192", s.DirtyBytes)
	}
	if d := c.(interface{ DirtyBytes() int64 }).DirtyBytes(); d != 0 {
		t.Fatalf("WriteCached left %d bytes dirty in the write-through cache", d)
	}
	if bytes.Equal(be.Current(1<<20, 8192), p) {
		t.Fatal("the target has the data before any write-back")
	}
	if cw.WriteCached(make([]byte, 512), 0) {
		t.Fatal("WriteCached took part of a 4 KiB unit, which the log must merge")
	}

	model := make([]byte, size)
	copy(model[1<<20:], p)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var taken atomic.Int64
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 9))
			region := int64(w) * (size / 4)
			for i := range 400 {
				n := int64(1+r.IntN(16)) * 512
				off := region + int64(r.IntN(int(size/4-n)/512))*512
				data := bytes.Repeat([]byte{byte(w*16 + i)}, int(n))
				if cw.WriteCached(data, off) {
					taken.Add(1)
				} else {
					if err := c.WriteAt(ctx, data, off, 0); err != nil {
						t.Error(err)
						return
					}
				}
				mu.Lock()
				copy(model[off:], data)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	all := make([]byte, size)
	if err := c.ReadAt(ctx, all, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(all, model) {
		t.Fatal("the stack reads back other data than written")
	}
	if taken.Load() == 0 {
		t.Fatal("WriteCached took none of the concurrent writes")
	}
	t.Logf("WriteCached took %d of 1600 writes", taken.Load())
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(be.Durable(0, size), model) {
		t.Fatal("the target differs from the model after detach")
	}
}
