package journal

import "math/bits"

// noLBA marks a ring unit that holds no live data block (a header, a wrap gap, a cleaned block).
const noLBA = ^uint64(0)

// index maps each logical block that has data in the log to the ring unit holding its newest
// copy. Its memory is fixed at open and proportional to the ring, not to the LUN: for every ring
// unit an 8-byte reverse entry (the LBA that unit holds) and two to four 4-byte slots of an
// open-addressing table (linear probing, at most half full), so 16 to 24 bytes per unit: 4 to 6
// MiB per GiB of cache device with 4 KiB blocks.
//
// Invariant: a slot holding unit u (stored as u+1; 0 is empty) is the slot of key rev[u], and no
// two slots hold the same key. A unit is live exactly when the table maps rev[u] to u.
//
// index is not safe for concurrent use: the Journal's mu guards it.
type index struct {
	rev   []uint64 // per ring unit: the LBA whose data it holds, or noLBA
	slots []uint32 // unit+1 or 0
	shift uint     // 64 - log2(len(slots))
	live  int64    // units mapped
}

func newIndex(units uint64) *index {
	n := uint64(1) << bits.Len64(2*units-1) // a power of two >= 2*units
	x := &index{rev: make([]uint64, units), slots: make([]uint32, n), shift: uint(64 - bits.TrailingZeros64(n))}
	for i := range x.rev {
		x.rev[i] = noLBA
	}
	return x
}

// memoryFor is what newIndex(units) allocates, in bytes.
func memoryFor(units uint64) int64 {
	n := uint64(1) << bits.Len64(2*units-1)
	return int64(units*8 + n*4)
}

func (x *index) home(lba uint64) uint64 { return (lba * 0x9E3779B97F4A7C15) >> x.shift }

// find returns the slot of lba and whether it is mapped there; when it is not, the slot is the
// empty one where it would go.
func (x *index) find(lba uint64) (uint64, bool) {
	mask := uint64(len(x.slots) - 1)
	for i := x.home(lba); ; i = (i + 1) & mask {
		v := x.slots[i]
		if v == 0 {
			return i, false
		}
		if x.rev[v-1] == lba {
			return i, true
		}
	}
}

// get returns the unit holding lba's newest data.
func (x *index) get(lba uint64) (uint64, bool) {
	i, ok := x.find(lba)
	if !ok {
		return 0, false
	}
	return uint64(x.slots[i] - 1), true
}

// set maps lba to unit u, which the caller has just filled with lba's data.
func (x *index) set(lba, u uint64) {
	i, ok := x.find(lba)
	if ok {
		x.rev[x.slots[i]-1] = noLBA
	} else {
		x.live++
	}
	x.rev[u] = lba
	x.slots[i] = uint32(u + 1)
}

// drop unmaps lba.
func (x *index) drop(lba uint64) {
	i, ok := x.find(lba)
	if !ok {
		return
	}
	x.rev[x.slots[i]-1] = noLBA
	x.live--
	x.removeSlot(i)
}

// dropUnit unmaps the block unit u holds, if u is still its newest copy.
func (x *index) dropUnit(u uint64) {
	lba := x.rev[u]
	if lba == noLBA {
		return
	}
	if got, ok := x.get(lba); ok && got == u {
		x.drop(lba)
	}
}

// live reports whether unit u holds the newest data of its block, and which block.
func (x *index) liveAt(u uint64) (uint64, bool) {
	lba := x.rev[u]
	if lba == noLBA {
		return 0, false
	}
	got, ok := x.get(lba)
	return lba, ok && got == u
}

// removeSlot empties slot i and shifts the following run back (linear probing's deletion, so no
// tombstones accumulate).
func (x *index) removeSlot(i uint64) {
	mask := uint64(len(x.slots) - 1)
	for j := (i + 1) & mask; x.slots[j] != 0; j = (j + 1) & mask {
		h := x.home(x.rev[x.slots[j]-1])
		// Move slot j into the hole at i when its home is not in (i, j] (cyclically).
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = 0
}

// each calls fn for every block of [lba, lba+n) the index maps, with the unit holding it, until
// fn returns false: block by block for a range no longer than the ring, by a walk of the reverse
// map for a longer one (a discard of the whole LUN), so that it costs at most one pass over the
// ring. fn may drop the block it is given. The order is by LBA for a short range only.
func (x *index) each(lba, n uint64, fn func(lba, u uint64) bool) {
	if x.live == 0 {
		return
	}
	if n <= uint64(len(x.rev)) {
		for i := range n {
			if u, ok := x.get(lba + i); ok && !fn(lba+i, u) {
				return
			}
		}
		return
	}
	for u := range x.rev {
		if b, ok := x.liveAt(uint64(u)); ok && b >= lba && b-lba < n && !fn(b, uint64(u)) {
			return
		}
	}
}
