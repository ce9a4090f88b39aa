package cache

import "math/bits"

// dirtyIndex maps the page number of every dirty page to its slot (guarded by dmu, like the rest
// of the dirty state). The write-back coalescing scans (buildJobLocked, syncRange) look pages up
// by number; every scan ends on a page that is not dirty.
//
// It is an open-addressing table with linear probing and backward-shift deletion, so it never
// holds tombstones. Go's map did: a sequential write stream inserts and deletes every page once
// per pass over the working set, the deleted entries stay behind as tombstones in full groups,
// and the lookups of absent pages probed through them. In a 1 MiB sequential write through the
// write-back cache that was 15 % of the gateway's CPU, in ctrlGroup.matchH2. Here a lookup ends
// at the first empty slot, and the table is kept at most half full.
type dirtyIndex struct {
	keys  []int64 // page + 1; 0 marks an empty slot
	vals  []int32
	shift uint // 64 - log2(len(keys))
	n     int
}

// newDirtyIndex returns an index sized for hint pages without growing.
func newDirtyIndex(hint int) *dirtyIndex {
	d := &dirtyIndex{}
	d.alloc(max(16, 1<<bits.Len(uint(2*max(hint, 1)-1)))) // the next power of two >= 2*hint
	return d
}

func (d *dirtyIndex) alloc(size int) {
	d.keys = make([]int64, size)
	d.vals = make([]int32, size)
	d.shift = uint(64 - bits.TrailingZeros(uint(size)))
	d.n = 0
}

// home is the slot a page hashes to (Fibonacci hashing: consecutive pages spread out).
func (d *dirtyIndex) home(key int64) int {
	return int(uint64(key) * 0x9E3779B97F4A7C15 >> d.shift)
}

func (d *dirtyIndex) get(page int64) (int32, bool) {
	key, mask := page+1, len(d.keys)-1
	for i := d.home(key); ; i = (i + 1) & mask {
		switch d.keys[i] {
		case key:
			return d.vals[i], true
		case 0:
			return -1, false
		}
	}
}

func (d *dirtyIndex) put(page int64, s int32) {
	if 2*(d.n+1) > len(d.keys) {
		d.grow()
	}
	key, mask := page+1, len(d.keys)-1
	for i := d.home(key); ; i = (i + 1) & mask {
		switch d.keys[i] {
		case key:
			d.vals[i] = s
			return
		case 0:
			d.keys[i], d.vals[i] = key, s
			d.n++
			return
		}
	}
}

// del removes page, then shifts back the entries after it in its probe run that hashed at or
// before the hole, so that every entry stays reachable from its home slot without tombstones.
func (d *dirtyIndex) del(page int64) {
	key, mask := page+1, len(d.keys)-1
	i := d.home(key)
	for d.keys[i] != key {
		if d.keys[i] == 0 {
			return
		}
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; d.keys[j] != 0; j = (j + 1) & mask {
		// The entry at j may fill the hole at i if its home is not in the cyclic range (i, j].
		if h := d.home(d.keys[j]); (j-h)&mask >= (j-i)&mask {
			d.keys[i], d.vals[i] = d.keys[j], d.vals[j]
			i = j
		}
	}
	d.keys[i], d.vals[i] = 0, 0
	d.n--
}

func (d *dirtyIndex) grow() {
	keys, vals := d.keys, d.vals
	d.alloc(2 * len(keys))
	for i, k := range keys {
		if k != 0 {
			d.put(k-1, vals[i])
		}
	}
}
