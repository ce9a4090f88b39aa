package journal

// The recording behind crash_test.go: the cache device and the target log every write and flush
// in one global order (recorder, recMedia, recTarget), and replay rebuilds both devices as of
// any point of it, after a kill -9 or a power cut.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"testing"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache/internal/fakedev"
)

// evKind is what one recorded event did.
type evKind uint8

const (
	evMediaWrite     evKind = iota // a write to the cache device (lost at a power cut unless synced)
	evMediaSync                    // an fdatasync of the cache device
	evTargetWrite                  // a write to the target's volatile cache (data zeroes for a discard)
	evTargetWriteFUA               // a write that is durable on the target at once
	evTargetFlush                  // the target's cache flushed
)

type event struct {
	kind evKind
	off  int64
	data []byte
}

// recorder is the global order of every write and flush to the cache device and the target.
// Each device operation is performed and logged under mu, so that the log's order is the order
// in which the operations took effect, even with the cleaner's writes to the target running
// concurrently with the batch writer's to the cache device.
type recorder struct {
	mu sync.Mutex
	ev []event
}

// pos is the number of events so far: an operation acknowledged after reading pos P had all of
// its device I/O in ev[:P]; one that starts after reading P has none of it there.
func (r *recorder) pos() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ev)
}

// recMedia is a memMedia whose writes and syncs go to the recorder.
type recMedia struct {
	*memMedia
	r *recorder
}

func (m recMedia) WriteVAt(bufs [][]byte, off int64) error {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	if err := m.memMedia.WriteVAt(bufs, off); err != nil {
		return err
	}
	var all []byte
	for _, b := range bufs {
		all = append(all, b...)
	}
	m.r.ev = append(m.r.ev, event{kind: evMediaWrite, off: off, data: all})
	return nil
}

func (m recMedia) Sync() error {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	if err := m.memMedia.Sync(); err != nil {
		return err
	}
	m.r.ev = append(m.r.ev, event{kind: evMediaSync})
	return nil
}

// recTarget is a fakedev whose writes, discards, write-zeroes and flushes go to the recorder.
type recTarget struct {
	*fakedev.Dev
	r *recorder
}

func (t recTarget) log(kind evKind, off int64, data []byte) {
	t.r.ev = append(t.r.ev, event{kind: kind, off: off, data: data})
}

func (t recTarget) WriteAt(ctx context.Context, p []byte, off int64, flags block.WriteFlags) error {
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	if err := t.Dev.WriteAt(ctx, p, off, flags); err != nil {
		return err
	}
	kind := evTargetWrite
	if flags&block.FUA != 0 {
		kind = evTargetWriteFUA
	}
	t.log(kind, off, bytes.Clone(p))
	return nil
}

func (t recTarget) Discard(ctx context.Context, off, length int64) error {
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	if err := t.Dev.Discard(ctx, off, length); err != nil {
		return err
	}
	t.log(evTargetWrite, off, make([]byte, length))
	return nil
}

func (t recTarget) WriteZeroes(ctx context.Context, off, length int64, flags block.ZeroFlags) error {
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	if err := t.Dev.WriteZeroes(ctx, off, length, flags); err != nil {
		return err
	}
	kind := evTargetWrite
	if flags&block.ZeroFUA != 0 {
		kind = evTargetWriteFUA
	}
	t.log(kind, off, make([]byte, length))
	return nil
}

func (t recTarget) Flush(ctx context.Context) error {
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	if err := t.Dev.Flush(ctx); err != nil {
		return err
	}
	t.log(evTargetFlush, 0, nil)
	return nil
}

// replay rebuilds both devices event by event: the cache device as of its last sync (mDur) and
// with every write (mCur, the page cache), the target's durable image and what it reads.
type replay struct {
	ev         []event
	next       int
	mDur, mCur []byte
	unsynced   []int // media write events since the last sync
	tDur, tCur []byte
	tVol       []int // target write events since the last target flush
}

func newReplay(ev []event, mediaSize, lunSize int64) *replay {
	return &replay{ev: ev, mDur: make([]byte, mediaSize), mCur: make([]byte, mediaSize),
		tDur: make([]byte, lunSize), tCur: make([]byte, lunSize)}
}

// to applies the events up to (not including) k; k never goes back.
func (r *replay) to(k int) {
	for ; r.next < k; r.next++ {
		e := r.ev[r.next]
		switch e.kind {
		case evMediaWrite:
			copy(r.mCur[e.off:], e.data)
			r.unsynced = append(r.unsynced, r.next)
		case evMediaSync:
			for _, i := range r.unsynced {
				copy(r.mDur[r.ev[i].off:], r.ev[i].data)
			}
			r.unsynced = r.unsynced[:0]
		case evTargetWrite:
			copy(r.tCur[e.off:], e.data)
			r.tVol = append(r.tVol, r.next)
		case evTargetWriteFUA:
			copy(r.tCur[e.off:], e.data)
			copy(r.tDur[e.off:], e.data)
		case evTargetFlush:
			// A flush makes durable what reads see of every block written since the last one.
			for _, i := range r.tVol {
				w := r.ev[i]
				copy(r.tDur[w.off:], r.tCur[w.off:w.off+int64(len(w.data))])
			}
			r.tVol = r.tVol[:0]
		}
	}
}

// powerCut is the cache device after a power cut at the current point: the synced image plus
// the unsynced writes keep chooses (in their order), the last of those torn after torn modulo its
// length bytes when torn >= 0. It shares the replay's image until the replay moves on.
func (r *replay) powerCut(keep []bool, torn int) *overlayMedia {
	m := &overlayMedia{base: r.mDur}
	last := -1
	for i, ok := range keep {
		if ok {
			last = i
		}
	}
	for i, ok := range keep {
		if !ok {
			continue
		}
		w := r.ev[r.unsynced[i]]
		d := w.data
		if i == last && torn >= 0 && len(d) > 0 {
			d = d[:torn%len(d)]
		}
		m.over = append(m.over, mWrite{w.off, d})
	}
	return m
}

// killed is the cache device after kill -9: the page cache keeps every write.
func (r *replay) killed() *overlayMedia { return &overlayMedia{base: r.mCur} }

// overlayMedia is a cache device made of an image it never writes (shared with the replay, so
// that a crash point costs no copy of it) and the writes laid over it, in order.
type overlayMedia struct {
	mu   sync.Mutex
	base []byte
	over []mWrite
}

func (m *overlayMedia) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > int64(len(m.base)) {
		return 0, io.EOF
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	copy(p, m.base[off:])
	for _, w := range m.over {
		lo, hi := max(off, w.off), min(off+int64(len(p)), w.off+int64(len(w.data)))
		if lo < hi {
			copy(p[lo-off:hi-off], w.data[lo-w.off:])
		}
	}
	return len(p), nil
}

func (m *overlayMedia) WriteVAt(bufs [][]byte, off int64) error {
	var all []byte
	for _, b := range bufs {
		all = append(all, b...)
	}
	if off < 0 || off+int64(len(all)) > int64(len(m.base)) {
		return fmt.Errorf("overlaymedia: write at %d+%d past %d", off, len(all), len(m.base))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.over = append(m.over, mWrite{off, all})
	return nil
}

func (m *overlayMedia) Sync() error  { return nil }
func (m *overlayMedia) Size() int64  { return int64(len(m.base)) }
func (m *overlayMedia) Close() error { return nil }

// target is a fakedev whose durable image is dur and whose reads see cur.
func target(t *testing.T, bs uint32, dur, cur []byte) *fakedev.Dev {
	t.Helper()
	d := fakedev.New(int64(len(dur)), targetLimits(bs))
	for o := 0; o < len(dur); o += 1 << 20 {
		if err := d.WriteAt(ctx, dur[o:min(o+1<<20, len(dur))], int64(o), block.FUA); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(dur, cur) {
		for o := 0; o < len(cur); o += 1 << 20 {
			if err := d.WriteAt(ctx, cur[o:min(o+1<<20, len(cur))], int64(o), 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	d.ResetLog()
	return d
}
