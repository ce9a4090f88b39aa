package cache

import (
	"fmt"
	"runtime"
	"sort"
	"strings"
	"testing"
)

// allocsPerCall is testing.AllocsPerRun for the cache's zero-allocation checks, made to tell the
// path's allocations from the rest of the process's. AllocsPerRun counts every malloc the
// process makes while f runs, whoever makes it, and a 1 MiB call runs long enough under -race on
// a loaded CI host for allocations elsewhere to average one per call: CI failed once on "1 MiB
// read-around: 1 allocs per call", and the test passes in isolation, in its package and under
// load here. A path that allocates per call does so on every attempt, so the fewest of three
// attempts is its count; when every attempt allocates, the log names the allocating stacks of
// the whole process, so that a real regression reads as one and noise shows where it came from.
func allocsPerCall(t *testing.T, runs int, f func()) float64 {
	t.Helper()
	var n float64
	for attempt := 0; attempt < 3; attempt++ {
		if n = testing.AllocsPerRun(runs, f); n == 0 {
			return 0
		}
	}
	t.Logf("allocation sites while the calls ran:\n%s", allocSites(runs, f))
	return n
}

// allocSites runs f runs times with every allocation sampled and returns the stacks that
// allocated during them, most allocations first.
func allocSites(runs int, f func()) string {
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	before := allocsByStack()
	for i := 0; i < runs; i++ {
		f()
	}
	after := allocsByStack()
	type site struct {
		stack  [32]uintptr
		allocs int64
	}
	var sites []site
	for stack, n := range after {
		if d := n - before[stack]; d > 0 && !ownAllocation(stack[:]) {
			sites = append(sites, site{stack, d})
		}
	}
	sort.Slice(sites, func(i, j int) bool { return sites[i].allocs > sites[j].allocs })
	var b strings.Builder
	for i, s := range sites {
		if i == 8 {
			fmt.Fprintf(&b, "(%d more sites)\n", len(sites)-i)
			break
		}
		fmt.Fprintf(&b, "%d allocations in %d calls at\n", s.allocs, runs)
		frames := runtime.CallersFrames(trimStack(s.stack[:]))
		for {
			fr, more := frames.Next()
			fmt.Fprintf(&b, "\t%s (%s:%d)\n", fr.Function, fr.File, fr.Line)
			if !more {
				break
			}
		}
	}
	if len(sites) == 0 {
		b.WriteString("none this time: nothing in the process allocated while the calls ran\n")
	}
	return b.String()
}

// allocsByStack returns the allocation count of every stack in the memory profile, which holds
// the allocations up to the last completed GC (hence the GC first).
func allocsByStack() map[[32]uintptr]int64 {
	runtime.GC()
	n, _ := runtime.MemProfile(nil, true)
	records := make([]runtime.MemProfileRecord, n+64)
	n, _ = runtime.MemProfile(records, true)
	byStack := make(map[[32]uintptr]int64, n)
	for _, r := range records[:n] {
		byStack[r.Stack0] += r.AllocObjects
	}
	return byStack
}

// ownAllocation reports whether stack is allocsByStack's own (its map of the profile).
func ownAllocation(stack []uintptr) bool {
	frames := runtime.CallersFrames(trimStack(stack))
	for {
		fr, more := frames.Next()
		if strings.HasSuffix(fr.Function, ".allocsByStack") {
			return true
		}
		if !more {
			return false
		}
	}
}

func trimStack(s []uintptr) []uintptr {
	for i, pc := range s {
		if pc == 0 {
			return s[:i]
		}
	}
	return s
}

var allocSink []byte

// allocateOnce is a call that allocates each time, for the test of allocsPerCall.
//
//go:noinline
func allocateOnce() { allocSink = make([]byte, 64+len(allocSink)%2) }

// TestAllocsPerCallSeesThePath checks the helper itself: a call that allocates counts one
// allocation on every attempt, and the site named is the allocating function.
func TestAllocsPerCallSeesThePath(t *testing.T) {
	if n := allocsPerCall(t, 100, allocateOnce); n < 1 {
		t.Fatalf("a call that allocates counted %v allocations per call", n)
	}
	if sites := allocSites(100, allocateOnce); !strings.Contains(sites, "cache.allocateOnce") {
		t.Fatalf("allocation sites do not name the allocating function:\n%s", sites)
	}
	if n := allocsPerCall(t, 100, func() { allocSink = allocSink[:0] }); n != 0 {
		t.Fatalf("a call that does not allocate counted %v allocations per call", n)
	}
}
