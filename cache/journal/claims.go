package journal

import (
	"context"
	"fmt"

	"github.com/iser-blk/iser-blk/block"
)

// Claims keep the merge of a partial-unit write apart from an operation that goes to the target
// around the log (a discard, a write-zeroes, a large write) over the same unit. The merge reads
// the unit from the target when the log has none of it: read while such an operation is in
// flight, it could pick up the unit half-changed, or from before the change, and log that over
// the operation's result. So each merge claims its unit and each direct operation its units for
// their whole duration, and a claim waits while another claim of the other kind (or another
// merge) overlaps it: the two then happen one after the other, in either order, as two
// concurrent requests may. Direct operations do not exclude each other.

// claimKind says what holds a claim.
type claimKind uint8

const (
	claimMerge claimKind = iota
	claimDirect
)

type claim struct {
	lo, hi uint64 // units [lo, hi)
	kind   claimKind
}

func (c claim) conflicts(o claim) bool {
	return c.lo < o.hi && o.lo < c.hi && (c.kind == claimMerge || o.kind == claimMerge)
}

// claim waits until [lo, hi) can be claimed as kind and claims it; the caller releases it.
func (j *Journal) claim(ctx context.Context, lo, hi uint64, kind claimKind) (claim, error) {
	c := claim{lo, hi, kind}
	j.mu.Lock()
	for j.claimConflicts(c) {
		ch := j.changed.wait()
		j.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return c, fmt.Errorf("journal: waiting for an operation on the same blocks: %w", block.ContextError(ctx.Err()))
		case <-j.stop:
			return c, fmt.Errorf("journal: %w", block.ErrClosed)
		}
		j.mu.Lock()
	}
	j.claims = append(j.claims, c)
	j.mu.Unlock()
	return c, nil
}

func (j *Journal) claimConflicts(c claim) bool {
	for _, o := range j.claims {
		if c.conflicts(o) {
			return true
		}
	}
	return false
}

func (j *Journal) release(c claim) {
	j.mu.Lock()
	for i, o := range j.claims {
		if o == c {
			j.claims[i] = j.claims[len(j.claims)-1]
			j.claims = j.claims[:len(j.claims)-1]
			break
		}
	}
	j.mu.Unlock()
	j.changed.broadcast()
}
