package journal

// Crash consistency in the style of dm-log-writes: a workload runs on a Journal whose cache
// device and target both log every write and flush in one global order; then, for every sync
// of the cache device and for random points between syncs (dropping unsynced writes in the
// worst order, tearing the last one), the two devices are rebuilt as of that point, a new
// Journal recovers from them, and what it reads back is checked against a model of the
// acknowledged operations (volatile-cache semantics), and so is the target after a detach.

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache/internal/fakedev"
)

// The model of the workload: its operations in order, and per 4 KiB block the versions written
// to it.
type opKind uint8

const (
	opWrite  opKind = iota // through the log (FUA or not)
	opAround               // a large write, around the log
	opDiscard
	opZero
	opFlush
)

type modelOp struct {
	kind       opKind
	off, n     int64
	fua        bool
	start, ack int // recorder positions: before the call, after it returned
}

type version struct {
	op int // -1: the target's initial content
	h  uint64
}

const checkUnit = 4096 // every operation is aligned to it

type model struct {
	seed     maphash.Seed
	ops      []modelOp
	versions [][]version
	zeroH    uint64
	opened   int // the recorder's position when the workload's Open (the format) returned
}

func newModel(lun int64) *model {
	md := &model{seed: maphash.MakeSeed(), versions: make([][]version, lun/checkUnit)}
	md.zeroH = maphash.Bytes(md.seed, make([]byte, checkUnit))
	for b := range md.versions {
		md.versions[b] = []version{{op: -1, h: md.zeroH}}
	}
	return md
}

// add records an acknowledged operation and what it wrote (nil: zeroes).
func (md *model) add(o modelOp, data []byte) {
	i := len(md.ops)
	md.ops = append(md.ops, o)
	if o.kind == opFlush {
		return
	}
	for k := int64(0); k < o.n/checkUnit; k++ {
		h := md.zeroH
		if data != nil {
			h = maphash.Bytes(md.seed, data[k*checkUnit:(k+1)*checkUnit])
		}
		b := o.off/checkUnit + k
		md.versions[b] = append(md.versions[b], version{op: i, h: h})
	}
}

// check verifies what a journal recovered at recorder point k reads back (got, the whole LUN).
// After kill -9 (powerCut false) every operation acknowledged by k reads back, exactly the
// newest, or the operation in flight at k. After a power cut, every block holds the newest
// version that a completed Flush or FUA covered, or a version written after it by an operation
// started by k; nothing else.
func (md *model) check(got []byte, k int, powerCut bool) error {
	lastFlush, inflight := -1, -1
	for i, o := range md.ops {
		if o.ack <= k && o.kind == opFlush {
			lastFlush = i
		}
		if o.start <= k && o.ack > k {
			inflight = i
		}
	}
	durable := func(v version) bool {
		if v.op < 0 {
			return true
		}
		o := md.ops[v.op]
		if !powerCut {
			return o.ack <= k
		}
		return v.op < lastFlush || (o.fua && o.ack <= k)
	}
	bad := 0
	var first string
	for b, vs := range md.versions {
		h := maphash.Bytes(md.seed, got[int64(b)*checkUnit:int64(b+1)*checkUnit])
		req := 0
		for i, v := range vs {
			if durable(v) {
				req = i
			}
		}
		ok := h == vs[req].h
		for _, v := range vs[req+1:] {
			if ok {
				break
			}
			if powerCut {
				ok = md.ops[v.op].start <= k && h == v.h
			} else {
				ok = v.op == inflight && h == v.h
			}
		}
		if !ok {
			if bad == 0 {
				what := "an unknown version"
				for _, v := range vs {
					if v.h == h {
						what = fmt.Sprintf("the version of op %d", v.op)
					}
				}
				first = fmt.Sprintf("block %d (offset %d) reads %s; it needs op %d's or newer (ops on it: %v; last flush op %d, in flight %d)",
					b, int64(b)*checkUnit, what, vs[req].op, md.describe(vs), lastFlush, inflight)
			}
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d blocks wrong; first: %s", bad, first)
	}
	return nil
}

func (md *model) describe(vs []version) string {
	var s []string
	for _, v := range vs[1:] {
		o := md.ops[v.op]
		s = append(s, fmt.Sprintf("%d:%s[%d,%d)", v.op, [...]string{"w", "around", "discard", "zero", "flush"}[o.kind], o.start, o.ack))
	}
	return fmt.Sprint(s)
}

// crashConfig is one recorded workload.
type crashConfig struct {
	seed       uint64
	bs         uint32
	ops        int
	roundBytes int64
	random     int // crash points between sync marks
	stride     int // every stride-th sync mark is a crash point
}

const (
	crashLUN   = 2 << 20
	crashMedia = MinSize // a ring of 16 MiB - 8 KiB: a few hundred writes fill it
)

// runWorkload runs cfg's workload on a journal over a recording cache device and target, and
// returns the recording and the model.
func runWorkload(t *testing.T, cfg crashConfig) ([]event, *model) {
	rec := &recorder{}
	m := recMedia{newMemMedia(crashMedia), rec}
	be := recTarget{fakedev.New(crashLUN, targetLimits(cfg.bs)), rec}
	j, err := Open(m, be, testID, Options{CleanAfter: time.Millisecond, RoundBytes: cfg.roundBytes})
	if err != nil {
		t.Fatal(err)
	}
	md := newModel(crashLUN)
	md.opened = rec.pos()
	r := rand.New(rand.NewPCG(cfg.seed, 0x1b1b))
	const blocks = crashLUN / checkUnit
	nextFlush := 1 + r.IntN(8)
	do := func(o modelOp, data []byte, f func() error) {
		t.Helper()
		o.start = rec.pos()
		if err := f(); err != nil {
			t.Fatalf("seed %d: op %d (%+v): %v", cfg.seed, len(md.ops), o, err)
		}
		o.ack = rec.pos()
		md.add(o, data)
	}
	for range cfg.ops {
		n := int64(1+r.IntN(16)) * checkUnit
		p := r.IntN(100)
		if p >= 55 && p < 63 {
			n = int64(64+r.IntN(65)) * checkUnit
		} else if p >= 63 && p < 77 {
			n = int64(1+r.IntN(32)) * checkUnit
		}
		lo := int64(0)
		if r.IntN(10) < 3 { // a hot region: overlapping writes
			lo = blocks - 64 - n/checkUnit
		}
		off := (lo + r.Int64N(blocks-lo-n/checkUnit+1)) * checkUnit
		o := modelOp{off: off, n: n}
		switch {
		case p < 55 || p >= 77:
			data := crashData(len(md.ops), off, n)
			if r.IntN(20) == 0 {
				o.fua = true
			}
			var fl block.WriteFlags
			if o.fua {
				fl = block.FUA
			}
			cached := !o.fua && r.IntN(2) == 0 // as the RAM cache above tries it first
			do(o, data, func() error {
				if cached && j.WriteCached(data, off) {
					return nil
				}
				return j.WriteAt(ctx, data, off, fl)
			})
		case p < 63:
			o.kind = opAround
			data := crashData(len(md.ops), off, n)
			do(o, data, func() error { return j.WriteAt(ctx, data, off, 0) })
		case p < 70:
			o.kind = opDiscard
			do(o, nil, func() error { return j.Discard(ctx, off, n) })
		default:
			o.kind = opZero
			do(o, nil, func() error { return j.WriteZeroes(ctx, off, n, 0) })
		}
		if nextFlush--; nextFlush == 0 {
			do(modelOp{kind: opFlush}, nil, func() error { return j.Flush(ctx) })
			nextFlush = 1 + r.IntN(8)
		}
	}
	s := j.Stats()
	// kill -9 of the workload's journal: nothing more reaches either device.
	j.Abandon() //nolint:errcheck // the recording is complete; Abandon's own sync only adds a mark
	if s.Rounds == 0 || s.Logged < s.Capacity {
		t.Fatalf("seed %d: the workload did not wrap the ring and clean it: %+v", cfg.seed, s)
	}
	if ov := be.Overlaps(); len(ov) > 0 {
		t.Fatalf("seed %d: overlapping writes to the target: %v", cfg.seed, ov)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.ev, md
}

// crashData is op i's data: every 4 KiB block stamped with the op and its offset, so that no
// two versions of a block are equal.
func crashData(i int, off, n int64) []byte {
	d := fill(int(n), byte(i))
	for k := int64(0); k < n; k += checkUnit {
		binary.LittleEndian.PutUint64(d[k:], uint64(i)+1)
		binary.LittleEndian.PutUint64(d[k+8:], uint64(off+k))
	}
	return d
}

// crashCase is one crash point: the prefix of the recording and how the devices lost the rest.
type crashCase struct {
	k        int
	kill     bool // kill -9: the cache device keeps every write, the target its cache
	tCrash   bool // power cut of the target too: it keeps its durable image only
	keep     []bool
	torn     int
	describe string
}

// recoverAt recovers a journal from the devices of c and checks it and its detach.
func recoverAt(t *testing.T, cfg crashConfig, rp *replay, md *model, c crashCase) error {
	var m Media
	if c.kill {
		m = rp.killed()
	} else {
		m = rp.powerCut(c.keep, c.torn)
	}
	tcur := rp.tCur
	if c.tCrash {
		tcur = rp.tDur
	}
	be := target(t, cfg.bs, rp.tDur, tcur)
	j, err := Open(m, be, testID, Options{CleanAfter: time.Hour})
	if err != nil && c.k < md.opened && !c.kill && errors.Is(err, ErrForeign) {
		// A power cut during the format of a new device (nothing acknowledged yet) may leave a
		// torn superblock and no other: refused until --cache-dev-format, which is allowed.
		return nil
	}
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	got := make([]byte, crashLUN)
	for o := 0; o < crashLUN; o += 1 << 20 {
		if err := j.ReadAt(ctx, got[o:o+1<<20], int64(o)); err != nil {
			j.Abandon() //nolint:errcheck // the read's error is the one reported
			return fmt.Errorf("read at %d: %w", o, err)
		}
	}
	if err := md.check(got, c.k, !c.kill); err != nil {
		j.Abandon() //nolint:errcheck // the check's error is the one reported
		return err
	}
	if err := j.Close(); err != nil {
		return fmt.Errorf("detach: %w", err)
	}
	// The detach wrote everything back. A target that crashed too starts from its durable image
	// (its cache is empty), so that image must now equal what was read; one that kept its cache
	// reads it.
	after := be.Current(0, crashLUN)
	if c.tCrash {
		after = be.Durable(0, crashLUN)
	}
	if !bytes.Equal(after, got) {
		for b := 0; b < crashLUN; b += checkUnit {
			if !bytes.Equal(after[b:b+checkUnit], got[b:b+checkUnit]) {
				return fmt.Errorf("after the detach the target differs from what the journal read, first at offset %d", b)
			}
		}
	}
	if ov := be.Overlaps(); len(ov) > 0 {
		return fmt.Errorf("overlapping writes to the target at recovery: %v", ov)
	}
	return nil
}

// crashCases lists the crash points of a recording: every sync of the cache device (where a
// power cut and kill -9 leave the same cache device; the target crashes or not), and cfg.random
// points between them, each once as kill -9 and once as a power cut of both devices that keeps
// a random subset of the writes since the last sync, the last one kept torn.
func crashCases(ev []event, cfg crashConfig) []crashCase {
	var cs []crashCase
	marks := 0
	unsynced := make([]int, len(ev)+1) // media writes since the last sync, in ev[:k]
	for i, e := range ev {
		unsynced[i+1] = unsynced[i]
		switch e.kind {
		case evMediaWrite:
			unsynced[i+1]++
		case evMediaSync:
			unsynced[i+1] = 0
			marks++
			if marks%cfg.stride != 0 {
				continue
			}
			cs = append(cs,
				crashCase{k: i + 1, describe: "power cut of both at a sync", tCrash: true},
				crashCase{k: i + 1, describe: "kill -9 at a sync", kill: true})
		}
	}
	r := rand.New(rand.NewPCG(cfg.seed, 0xc4a5))
	for range cfg.random {
		k := 1 + r.IntN(len(ev))
		cs = append(cs, crashCase{k: k, kill: true, describe: "kill -9 between syncs"})
		n := unsynced[k]
		keep := make([]bool, n)
		how := r.IntN(4)
		for i := range keep {
			switch how {
			case 0: // all kept
				keep[i] = true
			case 1: // a random subset
				keep[i] = r.IntN(2) == 0
			case 2: // the older ones only: the newest lost
				keep[i] = i < n/2
			case 3: // the newest ones only: worst-case order
				keep[i] = i >= n/2
			}
		}
		torn := -1 // the last kept write torn at a random length (modulo its own)
		if r.IntN(3) > 0 {
			torn = r.IntN(1 << 30)
		}
		cs = append(cs, crashCase{k: k, tCrash: r.IntN(4) > 0, keep: keep, torn: torn,
			describe: fmt.Sprintf("power cut between syncs (keep mode %d of %d unsynced writes, torn at %d)", how, n, torn)})
	}
	return cs
}

func TestCrashConsistency(t *testing.T) {
	now := uint64(time.Now().UnixNano())
	configs := []crashConfig{
		{seed: 1, bs: 4096, ops: 900, roundBytes: 1 << 20, random: 300},
		{seed: 2, bs: 512, ops: 800, random: 200},
		{seed: now, bs: []uint32{512, 4096}[now%2], ops: 800, roundBytes: int64(now%3) << 20, random: 200},
	}
	for i := range configs {
		configs[i].stride = 1
		if raceEnabled { // a sample: a quarter of the sync marks, an eighth of the random points
			configs[i].stride, configs[i].random = 4, configs[i].random/8
		}
	}
	if testing.Short() {
		configs = configs[:1]
	}
	for _, cfg := range configs {
		t.Run(fmt.Sprintf("seed=%d/bs=%d", cfg.seed, cfg.bs), func(t *testing.T) {
			start := time.Now()
			ev, md := runWorkload(t, cfg)
			cs := crashCases(ev, cfg)
			// Crash points in recording order, so that one replay walks the recording once.
			slices.SortStableFunc(cs, func(a, b crashCase) int { return cmp.Compare(a.k, b.k) })
			rp := newReplay(ev, crashMedia, crashLUN)
			failed := 0
			for _, c := range cs {
				rp.to(c.k)
				if err := recoverAt(t, cfg, rp, md, c); err != nil {
					failed++
					if failed <= 5 {
						t.Errorf("seed %d (bs %d; rerun with this seed in configs), crash point %d of %d events, %s: %v",
							cfg.seed, cfg.bs, c.k, len(ev), c.describe, err)
					}
				}
			}
			if failed > 5 {
				t.Errorf("seed %d: %d crash points failed in all", cfg.seed, failed)
			}
			t.Logf("seed %d, bs %d: %d ops, %d events, %d crash points checked in %v", cfg.seed, cfg.bs,
				len(md.ops), len(ev), len(cs), time.Since(start).Round(time.Millisecond))
		})
	}
}
