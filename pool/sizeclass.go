package pool

// Size classes: which buffer sizes exist and which class serves a request of n bytes.

import (
	"fmt"
	"sort"
	"sync/atomic"
)

// class is one buffer size: its free stack and how many buffers a slab of it holds.
type class struct {
	size    int
	perSlab int
	head    atomic.Uint64 // tag<<32 | (unit index + 1); low half 0 = empty
	_       [40]byte      // keep hot heads on separate cache lines
}

// normalizeClasses returns the ascending class sizes and the largest one from cfg: the given
// Classes or powers of two from 4 KiB, cut at MaxClass, which is always a class.
func normalizeClasses(cfg Config) ([]int, int, error) {
	maxClass := cfg.MaxClass
	classes := append([]int(nil), cfg.Classes...)
	if len(classes) > 0 {
		if !sort.IntsAreSorted(classes) {
			return nil, 0, fmt.Errorf("pool: classes %v are not ascending", classes)
		}
		if maxClass == 0 {
			maxClass = classes[len(classes)-1]
		}
	} else {
		if maxClass == 0 {
			maxClass = defaultMaxClass
		}
		for c := defaultMinClass; c < maxClass; c *= 2 {
			classes = append(classes, c)
		}
	}
	for len(classes) > 0 && classes[len(classes)-1] > maxClass {
		classes = classes[:len(classes)-1]
	}
	if len(classes) == 0 || classes[len(classes)-1] != maxClass {
		classes = append(classes, maxClass)
	}
	for i, c := range classes {
		if c <= 0 {
			return nil, 0, fmt.Errorf("pool: class %d is not positive", c)
		}
		if i > 0 && (c == classes[i-1] || c%classes[0] != 0) {
			return nil, 0, fmt.Errorf("pool: class %d must be distinct and a multiple of the smallest class %d", c, classes[0])
		}
	}
	return classes, maxClass, nil
}

// MaxClass is the largest n Get accepts.
func (p *Pool) MaxClass() int { return p.maxClass }

// classFor returns the index of the smallest class that holds n bytes.
func (p *Pool) classFor(n int) int {
	for i := range p.classes {
		if p.classes[i].size >= n {
			return i
		}
	}
	return len(p.classes) - 1
}
