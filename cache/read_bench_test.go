package cache

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/block"
)

// warmDevSize is the device of the warm-read benchmarks; warmSet the working set read first (in
// 32 KiB reads, as the bench's warm-up does) and then in 1 MiB reads, all of it in cache.
const (
	warmDevSize = 256 << 20
	warmSet     = 128 << 20
)

// newWarmCache is a write-back cache with the default configuration over a memdev whose first
// warmSet bytes are cached clean. With submit the backend has a Submitter (as the iSCSI backend
// does), so that ReadCached sees what it sees in the gateway. hole, when positive, leaves every
// hole-th page of the working set uncached, the first at hole-1 (a partly cached 1 MiB read).
func newWarmCache(b *testing.B, submit bool, hole, readAround int64) *Cache {
	return newWarmCacheIn(b, submit, hole, readAround, false, false)
}

// newWarmCacheIn is newWarmCache, warmed by 4 KiB reads in random order when scattered (as
// random reads leave the cache: consecutive pages in slots all over the page memory), with
// huge pages asked of the page pool when huge.
func newWarmCacheIn(b *testing.B, submit bool, hole, readAround int64, scattered, huge bool) *Cache {
	var be block.Device = newMemDev(b, warmDevSize)
	if submit {
		be = &submitDev{Device: be}
	}
	c := newPooledCache(b, be, Config{Size: 256 << 20, MaxDirtyAge: time.Hour, ReadAround: readAround, HugePages: huge})
	ctx := context.Background()
	p := make([]byte, 32<<10)
	for off := int64(0); off < warmSet && !scattered; off += int64(len(p)) {
		if err := c.ReadAt(ctx, p, off); err != nil {
			b.Fatal(err)
		}
	}
	for _, pg := range rand.New(rand.NewPCG(1, 2)).Perm(int(warmSet / 4096)) {
		if err := c.ReadAt(ctx, p[:4096], int64(pg)*4096); scattered && err != nil {
			b.Fatal(err)
		}
		if !scattered {
			break
		}
	}
	if st := c.Stats(); st.CachedBytes < warmSet {
		b.Fatalf("warm-up cached %d bytes of %d", st.CachedBytes, warmSet)
	}
	if hole > 0 {
		for pg := hole - 1; pg < warmSet/c.ps; pg += hole {
			c.dropCleanPage(pg)
		}
	}
	return c
}

// dropCleanPage evicts page pg if it is cached clean and idle (a test's way to make a hole).
func (c *Cache) dropCleanPage(pg int64) {
	sh := c.shard(pg)
	sh.mu.Lock()
	s, ok := sh.m[pg]
	if ok && c.slots[s].pins == 0 && c.slots[s].busy.Load() == 0 {
		delete(sh.m, pg)
		c.slots[s].valid = 0
		c.slots[s].invalSeq++
	} else {
		ok = false
	}
	sh.mu.Unlock()
	if ok {
		c.freeSlot(s)
	}
}

// BenchmarkReadWarm1MiB reads the warm working set in 1 MiB sequential reads, each stream of a
// goroutine over its own part of it: at queue depth 1 and 8 (fio's seqread-1m-qd8 after the
// bench's warm-up). "cached" is the frontend's first try on its reader goroutine
// (block.CachedReader; over a backend without a Submitter, since with one ReadCached declines a
// read of ReadAround bytes), "pages" the worker's ReadAt with read-around off, "memcpy" the floor:
// copying 1 MiB from one buffer to another. "full" is warmed by 32 KiB reads in order (consecutive
// pages in consecutive slots), "scattered" by 4 KiB reads in random order (slots all over the
// page memory, as after random I/O), "-huge" with huge pages asked of the page pool. "partial"
// leaves the last page of every 1 MiB uncached: ReadCached declines before copying anything and
// ReadAt fills the page.
func BenchmarkReadWarm1MiB(b *testing.B) {
	const size = 1 << 20
	for _, qd := range []int{1, 8} {
		b.Run("memcpy/qd"+strconv.Itoa(qd), func(b *testing.B) {
			src := make([]byte, warmSet)
			runWarm(b, qd, size, func(p []byte, off int64) bool { copy(p, src[off:]); return true })
		})
		for _, v := range []struct {
			name            string
			scattered, huge bool
		}{{"scattered", true, false}, {"scattered-huge", true, true}} {
			b.Run("cached-"+v.name+"/qd"+strconv.Itoa(qd), func(b *testing.B) {
				c := newWarmCacheIn(b, false, 0, 0, v.scattered, v.huge)
				if !runWarm(b, qd, size, c.ReadCached) {
					b.Fatal("ReadCached declined a cached read")
				}
			})
		}
		for _, v := range []struct {
			name string
			hole int64
		}{{"full", 0}, {"partial", 256}} {
			b.Run("cached-"+v.name+"/qd"+strconv.Itoa(qd), func(b *testing.B) {
				c := newWarmCache(b, false, v.hole, 0)
				hits := runWarm(b, qd, size, c.ReadCached)
				if want := v.hole == 0; hits != want {
					b.Fatalf("ReadCached served %v, want %v", hits, want)
				}
			})
			b.Run("pages-"+v.name+"/qd"+strconv.Itoa(qd), func(b *testing.B) {
				c := newWarmCache(b, true, v.hole, -1)
				ctx := context.Background()
				runWarm(b, qd, size, func(p []byte, off int64) bool {
					if err := c.ReadAt(ctx, p, off); err != nil {
						b.Error(err)
					}
					return true
				})
			})
		}
	}
}

// runWarm runs read over qd sequential streams of size-byte reads, each over its own part of the
// working set, and reports whether the last read of each stream returned true (all alike).
func runWarm(b *testing.B, qd int, size int64, read func(p []byte, off int64) bool) bool {
	b.SetBytes(size)
	b.ReportAllocs()
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((qd + procs - 1) / procs)
	var next atomic.Int64
	var served, declined atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		p := make([]byte, size)
		part := warmSet / int64(qd)
		base := (next.Add(1) - 1) % int64(qd) * part
		var i int64
		ok := true
		for pb.Next() {
			ok = read(p, base+i%(part/size)*size)
			i++
		}
		if ok {
			served.Add(1)
		} else {
			declined.Add(1)
		}
	})
	b.StopTimer()
	return declined.Load() == 0 && served.Load() > 0
}
