package iser

// Path choice: each path is one session (or any Executor); commands go to the connected one with
// the fewest outstanding commands, ALUA-preferred ones first (alua.go).

import (
	"sync/atomic"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

// path is one session (or any Executor), its counters and, for a recoverable one, the state its
// maintainer keeps (recovery.go).
type path struct {
	ex          scsi.Executor
	name        string              // portal, for logs and PathStats
	liveness    connectedExecutor   // nil: always considered connected
	rec         recoverableExecutor // nil: no keepalive or reinstatement
	outstanding atomic.Int64
	commands    atomic.Uint64
	lastActive  atomic.Int64 // unix ns of the last completion (or of the first command after idle)

	downs, restores, replayedTotal atomic.Uint64
	aborts, lunResets              atomic.Uint64
	pending                        atomic.Int64 // commands failed by the current outage, to replay
	escalation                     atomic.Int32 // next command-timeout step (recovery.go); 0 after progress
	aluaClass                      atomic.Int32 // preference rank from ALUA (alua.go); 0 best
	aluaState                      atomic.Int32 // scsi.ALUAState, -1 unknown
	tpg                            atomic.Int32 // target port group of the path's port, -1 unknown
	nop                            nopRTT       // keepalive round trips (noprtt.go)
}

func (p *path) touch() { p.lastActive.Store(time.Now().UnixNano()) }

func (p *path) idle() time.Duration {
	return time.Duration(time.Now().UnixNano() - p.lastActive.Load())
}

// connectedExecutor is implemented by an Executor that knows whether its connection is up (a
// session.Session). The Device steers commands away from paths that are down, so a dead session,
// which fails commands instantly and so always looks least loaded, does not attract all of them.
type connectedExecutor interface {
	Connected() bool
}

func (p *path) up() bool { return p.liveness == nil || p.liveness.Connected() }

// pick returns the connected path with the fewest outstanding commands, preferring one other
// than skip; when none is connected, nil if a path is recovering (the caller waits for it),
// else any path (its command then fails with the connection's error).
func (d *Device) pick(skip *path) *path {
	if len(d.paths) == 1 {
		if p := d.paths[0]; p.up() || !d.recovering {
			return p
		}
		return nil
	}
	start := int(d.rr.Add(1)) % len(d.paths)
	var best *path
	var bestN int64
	var bestC int32
	for i := range d.paths {
		p := d.paths[(start+i)%len(d.paths)]
		if p == skip || !p.up() {
			continue
		}
		// ALUA rank first (optimized before non-optimized before standby), then load.
		c, n := p.aluaClass.Load(), p.outstanding.Load()
		if best == nil || c < bestC || (c == bestC && n < bestN) {
			best, bestN, bestC = p, n, c
			if n == 0 && c == 0 {
				break
			}
		}
	}
	if best == nil && skip != nil && skip.up() {
		best = skip // it came back already
	}
	if best == nil && !d.recovering {
		best = d.paths[start]
	}
	return best
}
