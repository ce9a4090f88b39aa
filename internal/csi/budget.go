package csi

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/dustin/go-humanize"

	"github.com/iser-blk/iser-blk/cache"
	"github.com/iser-blk/iser-blk/frontend/nbd"
)

// A gateway's memory is its registered buffer pool (--buffer-memory, mapped as it is used and
// kept), its cache pages (--cache-size, allocated as they fill) and the Go runtime around them.
// A lone gateway sizes the first two for the host (512 MiB and a sixteenth of the memory it may
// use); sixteen of them on one node would promise more than the node has. So the plugin divides
// one budget among the volumes it admits (--memory-budget over --max-volumes) and starts each
// gateway with explicit sizes from its share. Every size here is a bound, not a use: a pool and
// a cache reach their bounds only under load, and a budget of bounds is what keeps the node out
// of the OOM killer's reach when they all do.
const (
	// MinBufferMemory is the smallest pool attach accepts: two of NBD's largest payloads.
	MinBufferMemory = 2 * nbd.MaxPayload
	// MaxBufferMemory is attach's own default: a share never gets more than a lone gateway takes.
	MaxBufferMemory = 512 << 20
	// MinCacheSize is the smallest cache a share gives: write-back needs room to coalesce.
	MinCacheSize = 16 << 20
	// GatewayOverhead is what a gateway costs besides its pool and cache: the Go runtime, its
	// heap (the cache's page table, per-tag state, sessions) and its binary's resident pages.
	// An idle gateway over iSCSI/TCP holds about 15 MiB; twice that covers a loaded one.
	GatewayOverhead = 32 << 20
	// MinShare is the least memory one volume's gateway can run in.
	MinShare = MinBufferMemory + MinCacheSize + GatewayOverhead
)

// MemoryShare is the memory of one volume's gateway: its --buffer-memory and --cache-size.
type MemoryShare struct {
	BufferMemory int64
	CacheSize    int64
}

// Total is what the share promises: the two bounds and GatewayOverhead.
func (s MemoryShare) Total() int64 { return s.BufferMemory + s.CacheSize + GatewayOverhead }

// BudgetError is ShareOf's answer when budget cannot give volumes gateways MinShare each.
type BudgetError struct {
	Budget, Volumes int64
	Fits            int64 // how many volumes the budget holds at MinShare each
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("a memory budget of %s holds %d volumes of at least %s each, not %d: lower --max-volumes or raise --memory-budget",
		humanize.IBytes(uint64(e.Budget)), e.Fits, humanize.IBytes(MinShare), e.Volumes)
}

// VolumesFitting is how many gateways budget holds at MinShare each.
func VolumesFitting(budget int64) int64 { return max(budget, 0) / MinShare }

// ShareOf divides budget among volumes: a quarter of each share for the buffer pool (between
// MinBufferMemory and MaxBufferMemory), GatewayOverhead for the runtime and the rest for the
// cache, at most cache.SizeFor(memLimit) — what a lone gateway of this host takes. Sizes are
// whole MiB, so that they pass through the command line exactly.
func ShareOf(budget, volumes, memLimit int64) (MemoryShare, error) {
	if volumes <= 0 {
		return MemoryShare{}, fmt.Errorf("the memory budget is divided among --max-volumes, which must be at least 1 (got %d)", volumes)
	}
	per := budget / volumes
	if per < MinShare {
		return MemoryShare{}, &BudgetError{Budget: budget, Volumes: volumes, Fits: VolumesFitting(budget)}
	}
	const mib = 1<<20 - 1
	buf := min(max(per/4, MinBufferMemory), MaxBufferMemory) &^ mib
	cacheSize := min(per-buf-GatewayOverhead, cache.SizeFor(memLimit)) &^ mib
	return MemoryShare{BufferMemory: buf, CacheSize: cacheSize}, nil
}

// args is the share as attach flags.
func (s MemoryShare) args() []string {
	if s == (MemoryShare{}) {
		return nil // attach's own defaults (tests, and plugins built without a budget)
	}
	return []string{"--buffer-memory", fmt.Sprintf("%dMiB", s.BufferMemory>>20), "--cache-size", fmt.Sprintf("%dMiB", s.CacheSize>>20)}
}

// DefaultMaxVolumes is how many volumes a node takes when --max-volumes is not given and the
// budget holds them.
const DefaultMaxVolumes = 16

// MemoryPlan is how the plugin spends its budget: at most Volumes gateways of Share each.
type MemoryPlan struct {
	Budget  int64
	Volumes int64
	Share   MemoryShare
}

// PlanMemory divides budget among maxVolumes gateways. When fit is set (--max-volumes was not
// given), maxVolumes is lowered to what the budget holds at MinShare each, so that the plugin
// starts on a small node and tells the CO the truth in NodeGetInfo; otherwise a budget too small
// for maxVolumes is a *BudgetError.
func PlanMemory(budget, maxVolumes int64, fit bool, memLimit int64) (MemoryPlan, error) {
	if fit && VolumesFitting(budget) >= 1 {
		maxVolumes = min(maxVolumes, VolumesFitting(budget))
	}
	share, err := ShareOf(budget, maxVolumes, memLimit)
	if err != nil {
		return MemoryPlan{}, err
	}
	return MemoryPlan{Budget: budget, Volumes: maxVolumes, Share: share}, nil
}

// DefaultMemoryBudget is --memory-budget's default: half of what the plugin may use (its cgroup's
// limit, or the host's memory), since the gateways run beside the node's workloads.
const DefaultMemoryBudget = "50%"

// ParseBudget reads --memory-budget: a size ("8GiB") or a percentage of memLimit ("50%").
func ParseBudget(s string, memLimit int64) (int64, error) {
	s = strings.TrimSpace(s)
	if p, ok := strings.CutSuffix(s, "%"); ok {
		pct, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || pct <= 0 || pct > 100 {
			return 0, fmt.Errorf("--memory-budget %q: want a percentage in (0, 100] or a size", s)
		}
		if memLimit <= 0 {
			return 0, fmt.Errorf("--memory-budget %q: this host's memory is unknown; give a size", s)
		}
		return int64(float64(memLimit) * pct / 100), nil
	}
	n, err := humanize.ParseBytes(s)
	if err != nil || n == 0 || n > 1<<50 {
		return 0, fmt.Errorf("--memory-budget %q: want a percentage in (0, 100] or a size", s)
	}
	return int64(n), nil
}
