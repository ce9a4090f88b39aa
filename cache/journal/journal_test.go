package journal

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/block/blocktest"
	"github.com/iser-blk/iser-blk/cache/internal/fakedev"
)

var ctx = context.Background()

func targetLimits(bs uint32) block.Limits {
	return block.Limits{LogicalBlockSize: bs, PhysicalBlockSize: bs, MaxTransfer: 1 << 20,
		VolatileCache: true, CanFlush: true, CanFUA: true, CanDiscard: true, CanWriteZeroes: true,
		DiscardZeroes: true}
}

var testID = Identity{URL: "iscsi://127.0.0.1:3260/iqn.2026-12.test:lun/0", WWN: "naa.6001405abcdef"}

func openT(t *testing.T, m Media, be block.Device, opt Options) *Journal {
	t.Helper()
	j, err := Open(m, be, testID, opt)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// TestConformance runs blocktest on 4 KiB units (4 KiB blocks, and 512-byte blocks whose writes
// of part of a unit are merged) and on 512-byte units (a LUN that does not end on 4 KiB).
func TestConformance(t *testing.T) {
	for _, c := range []struct {
		name string
		bs   uint32
		size int64
	}{{"4096", 4096, 16 << 20}, {"512-merged", 512, 16 << 20}, {"512-units", 512, 16<<20 + 2048}} {
		t.Run(c.name, func(t *testing.T) {
			blocktest.Run(t, func(t *testing.T) block.Device {
				return openT(t, newMemMedia(32<<20), fakedev.New(c.size, targetLimits(c.bs)), Options{})
			})
		})
	}
}

// Writes of 512-byte blocks that cover parts of 4 KiB units, interleaved with whole-unit writes,
// discards and write-zeroes, read back as a byte model says, after kill -9 too, and reach the
// target intact.
func TestPartialUnits(t *testing.T) {
	const size = 4 << 20
	be := fakedev.New(size, targetLimits(512))
	m := newMemMedia(32 << 20)
	j := openT(t, m, be, Options{CleanAfter: 3 * time.Millisecond})
	model := make([]byte, size)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 3000 {
		n := int64(1+r.IntN(24)) * 512
		off := int64(r.IntN(int(size-n)/512)) * 512
		switch r.IntN(10) {
		case 0:
			if err := j.Discard(ctx, off, n); err != nil {
				t.Fatal(err)
			}
			clear(model[off : off+n])
		case 1:
			if err := j.WriteZeroes(ctx, off, n, 0); err != nil {
				t.Fatal(err)
			}
			clear(model[off : off+n])
		default:
			p := fill(int(n), byte(i))
			if r.IntN(2) == 0 && j.WriteCached(p, off) {
				copy(model[off:], p)
				break
			}
			if err := j.WriteAt(ctx, p, off, 0); err != nil {
				t.Fatal(err)
			}
			copy(model[off:], p)
		}
	}
	mustRead(t, j, 0, model)
	j2 := openT(t, m.reopened(), be, Options{CleanAfter: time.Hour})
	mustRead(t, j2, 0, model)
	if err := j2.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(be.Durable(0, size), model) {
		t.Fatal("the target differs from the model after detach")
	}
}

// WriteCached logs whole units below WriteAround without waiting, and declines what would need
// a merge, goes around the log, or would wait for room in the ring; what it logged survives a
// kill -9 like any write.
func TestWriteCached(t *testing.T) {
	const lun = 64 << 20
	be := fakedev.New(lun, targetLimits(512))
	m := newMemMedia(LogStart + MinSize) // a ring of 16 MiB
	j := openT(t, m, be, Options{CleanAfter: time.Hour})
	a := fill(8192, 3)
	if !j.WriteCached(a, 4096) {
		t.Fatal("WriteCached declined two whole units")
	}
	for _, c := range []struct {
		name   string
		n, off int64
	}{{"part of a unit", 512, 0}, {"unaligned", 4096, 512}, {"around the log", DefaultWriteAround, 1 << 20},
		{"past the end", 4096, lun}, {"empty", 0, 0}} {
		if j.WriteCached(make([]byte, c.n), c.off) {
			t.Errorf("WriteCached took a write it must decline: %s", c.name)
		}
	}
	// A target that fails every write: write-back frees no room, and the ring fills.
	be.SetFault(func(op fakedev.Op) error {
		if op.Kind == fakedev.Write {
			return errors.New("target down")
		}
		return nil
	})
	filled := 0
	for off := int64(2 << 20); j.WriteCached(fill(64<<10, byte(off>>16)), off); off += 64 << 10 {
		filled++
		if filled > MinSize/(64<<10) {
			t.Fatal("WriteCached took more than the ring holds")
		}
	}
	if filled < MinSize/(64<<10)/2 {
		t.Fatalf("WriteCached declined after %d writes of 64 KiB into a ring of 16 MiB", filled)
	}
	if s := j.Stats(); s.Waits != 0 {
		t.Fatalf("WriteCached waited for room %d times", s.Waits)
	}
	m2 := m.reopened() // kill -9
	be.SetFault(nil)
	if err := j.Abandon(); err != nil { // the killed process's goroutines end; it closed the target
		t.Fatal(err)
	}
	be.Reopen()
	j2 := openT(t, m2, be, Options{CleanAfter: time.Hour})
	mustRead(t, j2, 4096, a)
	mustRead(t, j2, 2<<20, fill(64<<10, byte((2<<20)>>16)))
	if err := j2.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(be.Durable(4096, 8192), a) {
		t.Fatal("detach did not write the logged data back")
	}
}

func fill(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// mustRead reads want's length at off, in requests of at most 1 MiB (the target's MaxTransfer).
func mustRead(t *testing.T, d block.Device, off int64, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	for o := 0; o < len(got); o += 1 << 20 {
		if err := d.ReadAt(ctx, got[o:min(o+1<<20, len(got))], off+int64(o)); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read at %d: data differs", off)
	}
}

// A flushed write survives kill -9 without reaching the target, is served again after the
// restart, and is written back to the target by the detach.
func TestKillKeepsWrites(t *testing.T) {
	be := fakedev.New(16<<20, targetLimits(4096))
	m := newMemMedia(32 << 20)
	j := openT(t, m, be, Options{CleanAfter: time.Hour})
	a, b := fill(8192, 1), fill(4096, 9)
	if err := j.WriteAt(ctx, a, 1<<20, 0); err != nil {
		t.Fatal(err)
	}
	if err := j.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := j.WriteAt(ctx, b, 4096, 0); err != nil { // acknowledged, not flushed
		t.Fatal(err)
	}
	if got := be.Current(1<<20, 8192); bytes.Equal(got, a) {
		t.Fatal("the target has the data before any write-back")
	}
	// kill -9: no Close; the page cache keeps everything acknowledged.
	j2 := openT(t, m.reopened(), be, Options{CleanAfter: time.Hour})
	mustRead(t, j2, 1<<20, a)
	mustRead(t, j2, 4096, b)
	if s := j2.Stats(); s.DirtyBytes != 12288 {
		t.Fatalf("dirty after recovery: %d bytes, want 12288", s.DirtyBytes)
	}
	if err := j2.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(be.Durable(1<<20, 8192), a) || !bytes.Equal(be.Durable(4096, 4096), b) {
		t.Fatal("detach did not write everything back durably")
	}
}

// The write-back cleans the log in the background and the ring is reused many times over, with
// 4 KiB units and with 512-byte units (whose ring ends in stubs too short for a header).
func TestRingWraps(t *testing.T) {
	for _, c := range []struct {
		name string
		bs   uint32
		size int64
	}{{"4096", 4096, 8 << 20}, {"512-units", 512, 8<<20 + 2048}} {
		t.Run(c.name, func(t *testing.T) { testRingWraps(t, c.bs, c.size) })
	}
}

func testRingWraps(t *testing.T, bs uint32, size int64) {
	be := fakedev.New(size, targetLimits(bs))
	m := newMemMedia(16<<20 + LogStart + 1536) // 1536: the 512-byte ring does not end on a header
	j := openT(t, m, be, Options{CleanAfter: 5 * time.Millisecond})
	model := make([]byte, size)
	r := rand.New(rand.NewPCG(1, 2))
	// 5,000 writes of 4-64 KiB log about 170 MiB: the 16 MiB ring wraps ten times, at a different
	// offset each time (20,000 wrapped it 41 times and cost 44 s under -race).
	for i := range 5000 {
		n := (1 + r.IntN(16)) * 4096
		off := int64(r.IntN(int(size)-n)) / int64(bs) * int64(bs)
		p := fill(n, byte(i))
		if err := j.WriteAt(ctx, p, off, 0); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], p)
		if i%250 == 0 {
			if err := j.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if s := j.Stats(); s.Rounds == 0 || s.Logged < 8*s.Capacity {
		t.Fatalf("the ring did not wrap: %+v", s)
	}
	mustRead(t, j, 0, model)
	j2 := openT(t, m.reopened(), be, Options{CleanAfter: time.Hour})
	mustRead(t, j2, 0, model)
	if err := j2.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(be.Durable(0, size), model) {
		t.Fatal("the target differs from the model after detach")
	}
}

// Large writes, discards and write-zeroes go to the target around the log, and older log data
// of their range is never replayed over them.
func TestAroundInvalidates(t *testing.T) {
	be := fakedev.New(8<<20, targetLimits(4096))
	m := newMemMedia(32 << 20)
	j := openT(t, m, be, Options{CleanAfter: time.Hour})
	old := fill(64<<10, 3)
	for _, off := range []int64{0, 1 << 20, 2 << 20} {
		if err := j.WriteAt(ctx, old[:4096], off, 0); err != nil {
			t.Fatal(err)
		}
	}
	big := fill(512<<10, 5)
	if err := j.WriteAt(ctx, big, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := j.Discard(ctx, 1<<20, 64<<10); err != nil {
		t.Fatal(err)
	}
	if err := j.WriteZeroes(ctx, 2<<20, 64<<10, 0); err != nil {
		t.Fatal(err)
	}
	if err := j.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	zero := make([]byte, 64<<10)
	check := func(d block.Device) {
		t.Helper()
		mustRead(t, d, 0, big)
		mustRead(t, d, 1<<20, zero)
		mustRead(t, d, 2<<20, zero)
	}
	check(j)
	if s := j.Stats(); s.Around != 512<<10 {
		t.Fatalf("around: %d", s.Around)
	}
	j2 := openT(t, m.powerCut(func(int) (bool, int) { return false, -1 }), be, Options{CleanAfter: time.Hour})
	check(j2)
	if err := j2.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(be.Durable(0, 512<<10), big) || !bytes.Equal(be.Durable(1<<20, 64<<10), zero) {
		t.Fatal("the target lost an operation that went around the log")
	}
}

func TestRefusesForeign(t *testing.T) {
	be := fakedev.New(8<<20, targetLimits(4096))
	m := newMemMedia(32 << 20)
	j := openT(t, m, be, Options{})
	if err := j.Abandon(); err != nil {
		t.Fatal(err)
	}
	other := testID
	other.WWN = "naa.600140511111111"
	if _, err := Open(m.reopened(), be, other, Options{}); !errors.Is(err, ErrForeign) {
		t.Fatalf("another LUN's cache: %v", err)
	}
	if _, err := Open(m.reopened(), be, other, Options{Format: true}); err != nil {
		t.Fatalf("--cache-dev-format: %v", err)
	}
	junk := newMemMedia(32 << 20)
	junk.cur[100] = 1
	if _, err := Open(junk, be, testID, Options{}); !errors.Is(err, ErrForeign) {
		t.Fatalf("a device holding data: %v", err)
	}
	if _, err := Open(newMemMedia(MinSize-1), be, testID, Options{}); err == nil {
		t.Fatal("a device below MinSize was accepted")
	}
}

// A first format cut short (one superblock copy torn, the other never written) is formatted
// again: nothing can have been acknowledged through it. Two torn copies, or a copy that is not
// ours beside a zero one (a partition table), are still refused.
func TestTornFirstFormat(t *testing.T) {
	be := fakedev.New(8<<20, targetLimits(4096))
	formatted := newMemMedia(32 << 20)
	if err := openT(t, formatted, be, Options{}).Abandon(); err != nil {
		t.Fatal(err)
	}
	be.Reopen()
	torn := func(copies ...int) *memMedia {
		m := newMemMedia(32 << 20)
		for _, c := range copies {
			copy(m.cur[c*SuperSize:c*SuperSize+512], formatted.cur[c*SuperSize:]) // one sector of it
		}
		return m
	}
	for _, c := range []int{0, 1} {
		j, err := Open(torn(c), be, testID, Options{})
		if err != nil {
			t.Fatalf("copy %d torn, the other blank: %v", c, err)
		}
		if err := j.Abandon(); err != nil {
			t.Fatal(err)
		}
		be.Reopen()
	}
	if _, err := Open(torn(0, 1), be, testID, Options{}); !errors.Is(err, ErrForeign) {
		t.Fatalf("both copies torn: %v", err)
	}
	mbr := newMemMedia(32 << 20)
	mbr.cur[510], mbr.cur[511] = 0x55, 0xaa
	if _, err := Open(mbr, be, testID, Options{}); !errors.Is(err, ErrForeign) {
		t.Fatalf("a partition table: %v", err)
	}
}

// The index of a 64 GiB cache device takes 256 MiB (4 MiB per GiB: docs/cache-dev.md), for
// 512-byte and 4 KiB LUNs alike: it fits the default --cache-size of 1 GiB.
func TestIndexMemory(t *testing.T) {
	for _, bs := range []int{512, 4096} {
		if got := IndexMemory(64<<30+LogStart, 1<<40, bs); got != 256<<20 {
			t.Errorf("%d-byte blocks: %d bytes, want 256 MiB", bs, got)
		}
	}
	if got := IndexMemory(64<<30+LogStart, 1<<40+512, 512); got != 8*256<<20 {
		t.Errorf("512-byte units: %d bytes, want 2 GiB", got)
	}
}

// Keep (a planned restart) makes Close leave the log as it is: nothing is written back, and the
// successor recovers all of it; without Keep, Close writes everything back first.
func TestKeepLeavesTheLog(t *testing.T) {
	be := fakedev.New(8<<20, targetLimits(4096))
	m := newMemMedia(32 << 20)
	j := openT(t, m, be, Options{CleanAfter: time.Hour})
	p := fill(64<<10, 7)
	if err := j.WriteAt(ctx, p, 1<<20, 0); err != nil {
		t.Fatal(err)
	}
	j.Keep()
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(be.Current(1<<20, 64<<10), p) {
		t.Fatal("Close after Keep wrote the log back")
	}
	be.Reopen() // the successor logs in again
	j2 := openT(t, m.reopened(), be, Options{CleanAfter: time.Hour})
	if s := j2.Stats(); s.DirtyBytes != 64<<10 {
		t.Fatalf("the successor recovered %d bytes, want %d", s.DirtyBytes, 64<<10)
	}
	mustRead(t, j2, 1<<20, p)
	if err := j2.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(be.Durable(1<<20, 64<<10), p) {
		t.Fatal("Close without Keep did not write the log back")
	}
}

// Data waits CleanAfter in the log, counted from when the log became non-empty, and is then
// written back without any other reason (no kick, no Flush, no Close).
func TestCleanAfterAge(t *testing.T) {
	be := fakedev.New(8<<20, targetLimits(4096))
	const age = 300 * time.Millisecond
	j := openT(t, newMemMedia(32<<20), be, Options{CleanAfter: age})
	defer j.Close()
	p := fill(8192, 5)
	t0 := time.Now()
	if err := j.WriteAt(ctx, p, 1<<20, 0); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(be.Current(1<<20, 8192), p) {
		t.Fatal("written back at once")
	}
	for !bytes.Equal(be.Durable(1<<20, 8192), p) || j.Stats().LogBytes != 0 {
		if time.Since(t0) > 10*time.Second {
			t.Fatalf("not written back 10 s after the write (CleanAfter %v): %+v", age, j.Stats())
		}
		time.Sleep(5 * time.Millisecond) // polling the target's state, not synchronising
	}
	if took := time.Since(t0); took < age {
		t.Fatalf("written back after %v, before CleanAfter %v", took, age)
	}
	if s := j.Stats(); s.DirtyBytes != 0 || s.Rounds == 0 {
		t.Fatalf("after the write-back: %+v", s)
	}
}

// A write of part of a unit and a write-zeroes of the whole unit, issued together, end as one
// after the other in either order: the unit's other sectors read back as zeroes, never as the
// target's data from before the write-zeroes (which a merge reading the target mid-operation
// would log over it). The target is slowed and yields, to widen the window.
func TestPartialWriteBesideDirect(t *testing.T) {
	const units = 64
	be := fakedev.New(units*4096, targetLimits(512))
	old := bytes.Repeat([]byte{0xaa}, units*4096)
	if err := be.WriteAt(ctx, old, 0, block.FUA); err != nil {
		t.Fatal(err)
	}
	be.SetBefore(func(op fakedev.Op) {
		if op.Kind == fakedev.Zero || op.Kind == fakedev.Read {
			time.Sleep(200 * time.Microsecond) // widening the window, not synchronising
		}
	})
	j := openT(t, newMemMedia(32<<20), be, Options{CleanAfter: time.Hour})
	sector := bytes.Repeat([]byte{0x55}, 512)
	for u := int64(0); u < units; u++ {
		errs := make(chan error, 2)
		go func() { errs <- j.WriteZeroes(ctx, u*4096, 4096, 0) }()
		go func() { errs <- j.WriteAt(ctx, sector, u*4096, 0) }()
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		got := make([]byte, 4096)
		if err := j.ReadAt(ctx, got, u*4096); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[512:], make([]byte, 4096-512)) {
			t.Fatalf("unit %d: sectors 1-7 hold data from before the write-zeroes", u)
		}
		if s0 := got[:512]; !bytes.Equal(s0, sector) && !bytes.Equal(s0, make([]byte, 512)) {
			t.Fatalf("unit %d: sector 0 is neither the write nor zeroes", u)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
}

// Writers that try WriteCached first and fall back to WriteAt, as the cache above does, all at
// once: WriteCached hands the batch writer's role to a queued append when it leaves, and every
// write reads back, also after a kill -9.
func TestWriteCachedConcurrent(t *testing.T) {
	const writers, each, region = 8, 300, 1 << 20
	be := fakedev.New(writers*region, targetLimits(4096))
	m := newMemMedia(64 << 20)
	j := openT(t, m, be, Options{CleanAfter: time.Hour})
	model := make([]byte, writers*region)
	var wg sync.WaitGroup
	var taken atomic.Int64
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 5))
			for i := range each {
				n := int64(1+r.IntN(8)) * 4096
				off := int64(w)*region + int64(r.IntN(int(region-n)/4096))*4096
				p := fill(int(n), byte(w*31+i))
				if j.WriteCached(p, off) {
					taken.Add(1)
				} else if err := j.WriteAt(ctx, p, off, 0); err != nil {
					errs <- err
					return
				}
				copy(model[off:], p) // each writer its own region
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if taken.Load() == 0 {
		t.Fatal("WriteCached took none of the writes")
	}
	t.Logf("WriteCached took %d of %d writes", taken.Load(), writers*each)
	mustRead(t, j, 0, model)
	m2 := m.reopened() // kill -9
	if err := j.Abandon(); err != nil {
		t.Fatal(err)
	}
	be.Reopen()
	j2 := openT(t, m2, be, Options{CleanAfter: time.Hour})
	mustRead(t, j2, 0, model)
	if err := j2.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(be.Durable(0, writers*region), model) {
		t.Fatal("the target differs from the model after detach")
	}
}
