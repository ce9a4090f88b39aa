package cache

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// allocsPerCall is testing.AllocsPerRun for the cache's zero-allocation checks, given three
// attempts. AllocsPerRun counts every malloc the test process makes while f runs, on any
// goroutine: the cache's own workers, the runtime refilling what a GC emptied, a sync.Pool
// dropping items under -race. A path that allocates on every call does so in every attempt, so
// the fewest of three is its count; what it can hide is an allocation that only some calls make
// and only under some timing, which a single attempt would report no better than by chance.
// Every attempt that counts an allocation is logged, and when all three do, so are the stacks
// that allocated (of the whole process), so that a real regression names its site and a retried
// attempt leaves a trace in the CI log.
func allocsPerCall(t *testing.T, runs int, f func()) float64 {
	t.Helper()
	fewest := -1.0
	for attempt := range 3 {
		n := testing.AllocsPerRun(runs, f)
		if n == 0 {
			return 0
		}
		t.Logf("attempt %d of 3: %v allocations per call", attempt+1, n)
		if fewest < 0 || n < fewest {
			fewest = n
		}
	}
	t.Logf("allocation sites while the calls ran again:\n%s", allocSites(runs, f))
	return fewest
}

// allocSites runs f runs times (on one P, as AllocsPerRun does) with every allocation sampled,
// and returns the stacks of the whole process that allocated meanwhile, most allocations first.
func allocSites(runs int, f func()) string {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	before := allocsByStack()
	for range runs {
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
	slices.SortFunc(sites, func(a, b site) int { return int(b.allocs - a.allocs) })
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
	var records []runtime.MemProfileRecord
	n, ok := runtime.MemProfile(nil, true)
	for !ok { // new stacks may be recorded between the calls: grow until all fit
		records = make([]runtime.MemProfileRecord, n+64)
		n, ok = runtime.MemProfile(records, true)
	}
	byStack := make(map[[32]uintptr]int64, n)
	for _, r := range records[:n] {
		byStack[r.Stack0] += r.AllocObjects // records may share a stack (cut at 32 frames)
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

// allocatePerCall is a call that allocates every time, for the test of allocsPerCall.
//
//go:noinline
func allocatePerCall() { allocSink = make([]byte, 64) }

// TestAllocsPerCallSeesThePath checks the helper itself: a call that allocates every time counts
// at least one allocation per call, and the site named is the allocating function; a call that
// allocates only during the first attempt counts none (the retry), and one that never
// allocates counts none.
func TestAllocsPerCallSeesThePath(t *testing.T) {
	if n := allocsPerCall(t, 100, allocatePerCall); n < 1 {
		t.Fatalf("a call that allocates counted %v allocations per call", n)
	}
	if sites := allocSites(100, allocatePerCall); !strings.Contains(sites, "cache.allocatePerCall") {
		t.Fatalf("allocation sites do not name the allocating function:\n%s", sites)
	}
	calls := 0
	firstAttemptOnly := func() { // AllocsPerRun makes one warm-up call and then runs calls
		if calls++; calls <= 101 {
			allocatePerCall()
		}
	}
	if n := allocsPerCall(t, 100, firstAttemptOnly); n != 0 {
		t.Fatalf("a call that allocated in the first attempt only counted %v allocations per call", n)
	}
	if calls <= 101 {
		t.Fatalf("the helper made no second attempt (%d calls)", calls)
	}
	if n := allocsPerCall(t, 100, func() { allocSink = allocSink[:0] }); n != 0 {
		t.Fatalf("a call that does not allocate counted %v allocations per call", n)
	}
}
