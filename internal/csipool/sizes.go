package csipool

// LUN sizes: read from each LUN (READ CAPACITY, through backend/iser as `iser-blk info` does)
// and cached, since a size does not change while the LUN sits in the pool and a probe costs a
// login. A LUN that cannot be probed (portal down, LUN gone, CHAP refused) is skipped with the
// reason logged and tried again after a back-off, so one dead LUN neither stops the controller
// nor makes every CreateVolume wait for its login timeout.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
)

// Prober reads a LUN's size in bytes. Size is called for one LUN at a time per goroutine, from
// several goroutines at once.
type Prober interface {
	Size(ctx context.Context, lun LUN) (int64, error)
}

// ISERProber probes LUNs through backend/iser: it logs in (read-only), takes the capacity the
// LUN reports and logs out.
type ISERProber struct {
	// Options are the login's: InitiatorName is required. CHAP may hold a secret without a
	// user: it is then used for the LUNs whose URL names a user (user@host), and the others log
	// in without CHAP. ReadOnly and AlternateTargets are set per LUN.
	Options iser.Options
}

// Size implements Prober.
func (p ISERProber) Size(ctx context.Context, lun LUN) (int64, error) {
	d, err := openLUN(ctx, p.Options, lun, true) // a probe never writes
	if err != nil {
		return 0, err
	}
	size := d.Size()
	if err := d.Close(); err != nil {
		// The size is read; a failed logout only leaves the target to time the session out.
		if p.Options.Logger != nil {
			p.Options.Logger.Warn("logout after probing the LUN's size failed", zap.String("lun", lun.Key), zap.Error(err))
		}
	}
	if size <= 0 {
		return 0, fmt.Errorf("the LUN reports %d bytes", size)
	}
	return size, nil
}

// probeParallel bounds the probes in flight: each is a login to an array that may be serving.
const probeParallel = 4

// sizeEntry is what is known of one LUN's size.
type sizeEntry struct {
	size     int64     // > 0 once known
	failedAt time.Time // the last failed probe, when size is 0
	err      error     // its error
}

// sizeCache is the known sizes by LUN key.
type sizeCache struct {
	prober Prober
	retry  time.Duration    // back-off after a failed probe
	now    func() time.Time // the clock (tests)
	log    *zap.Logger

	// probing is a one-slot semaphore: one probe round at a time, so concurrent callers do not
	// log in to the same LUN twice. Never taken while Controller.mu is held (doc.go).
	probing chan struct{}

	mu      sync.Mutex // a leaf: held for map access only
	entries map[string]sizeEntry
}

func newSizeCache(p Prober, retry time.Duration, now func() time.Time, log *zap.Logger) *sizeCache {
	return &sizeCache{prober: p, retry: retry, now: now, log: log, probing: make(chan struct{}, 1), entries: map[string]sizeEntry{}}
}

// get is the LUN's size, 0 when unknown.
func (s *sizeCache) get(key string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.entries[key].size
}

// set records a size learnt elsewhere (a claim's, when its volume is deleted).
func (s *sizeCache) set(key string, size int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.entries[key] = sizeEntry{size: size}
}

// due is whether the LUN should be probed now: its size is unknown and no probe failed within
// the back-off.
func (s *sizeCache) due(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[key]
	return e.size == 0 && (e.failedAt.IsZero() || s.now().Sub(e.failedAt) >= s.retry)
}

// probe reads the size of every LUN of luns that is due, probeParallel at a time, and returns
// when all are done, or when ctx ends and the probes in flight (which end with ctx) returned. A failure is logged and recorded, never returned: the
// LUN is skipped until the back-off passes.
func (s *sizeCache) probe(ctx context.Context, luns []LUN) error {
	select {
	case s.probing <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.probing }()
	var due []LUN
	for _, l := range luns {
		if s.due(l.Key) {
			due = append(due, l)
		}
	}
	if len(due) == 0 {
		return nil
	}
	var wg sync.WaitGroup
	slots := make(chan struct{}, probeParallel)
	for _, l := range due {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			s.probeOne(ctx, l)
		}()
	}
	wg.Wait()
	return ctx.Err()
}

// probeOne probes one LUN and records the outcome.
func (s *sizeCache) probeOne(ctx context.Context, l LUN) {
	size, err := s.prober.Size(ctx, l)
	if err == nil && size <= 0 {
		err = fmt.Errorf("the LUN reports %d bytes", size)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.entries[l.Key] = sizeEntry{failedAt: s.now(), err: err}
		s.log.Warn("skipping a pool LUN whose size cannot be read; it is probed again later",
			zap.String("lun", l.Key), zap.String("target", iser.RedactURL(l.URLs[0])), zap.Int("line", l.Line),
			zap.Duration("retry_after", s.retry), zap.Error(err))
		return
	}
	s.entries[l.Key] = sizeEntry{size: size}
	s.log.Debug("pool LUN probed", zap.String("lun", l.Key), zap.Int64("size", size))
}
