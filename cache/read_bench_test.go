package cache

import (
	"context"
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
	var be block.Device = newMemDev(b, warmDevSize)
	if submit {
		be = &submitDev{Device: be}
	}
	c := newPooledCache(b, be, Config{Size: 256 << 20, MaxDirtyAge: time.Hour, ReadAround: readAround})
	ctx := context.Background()
	p := make([]byte, 32<<10)
	for off := int64(0); off < warmSet; off += int64(len(p)) {
		if err := c.ReadAt(ctx, p, off); err != nil {
			b.Fatal(err)
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
// (block.CachedReader, with a backend Submitter as in the gateway), "readat" the worker's ReadAt
// with the default configuration, "memcpy" the floor: copying 1 MiB from one buffer to another.
// "partial" leaves the last page of every 1 MiB uncached: ReadCached declines (how cheaply is the point) and
// ReadAt reads around.
func BenchmarkReadWarm1MiB(b *testing.B) {
	const size = 1 << 20
	for _, qd := range []int{1, 8} {
		b.Run("memcpy/qd"+strconv.Itoa(qd), func(b *testing.B) {
			src := make([]byte, warmSet)
			runWarm(b, qd, size, func(p []byte, off int64) bool { copy(p, src[off:]); return true })
		})
		for _, v := range []struct {
			name string
			hole int64
		}{{"full", 0}, {"partial", 256}} {
			b.Run("cached-"+v.name+"/qd"+strconv.Itoa(qd), func(b *testing.B) {
				c := newWarmCache(b, warmSubmit, v.hole, 0)
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
var warmSubmit = true

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
