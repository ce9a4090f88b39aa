//go:build e2e

package iser

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/test/e2e/tgtd"
)

// writeLoad is concurrent writers, each over its own blocks of one device, that refill one
// buffer with fresh random data for every write, the moment the last one returned: what the
// outage tests run across a target's outage. It remembers the last data written to each block.
type writeLoad struct {
	mu   sync.Mutex
	last map[int64][]byte
	errs []error
	ops  int
	stop chan struct{}
	wg   sync.WaitGroup
}

// startWriteLoad starts workers writers on d, each writing bsz-byte blocks at random among its
// own blocks; with readBack each write is read back and compared before the next.
func startWriteLoad(ctx context.Context, d *Device, workers, blocks, bsz int, seed uint64, readBack bool) *writeLoad {
	l := &writeLoad{last: map[int64][]byte{}, stop: make(chan struct{})}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), seed))
			buf := make([]byte, bsz)
			got := make([]byte, bsz)
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				off := int64(w*blocks+rng.IntN(blocks)) * int64(bsz)
				for i := 0; i < len(buf); i += 8 {
					v := rng.Uint64()
					for j := range 8 {
						buf[i+j] = byte(v >> (8 * j))
					}
				}
				err := d.WriteAt(ctx, buf, off, 0)
				if err == nil && readBack {
					err = d.ReadAt(ctx, got, off)
					if err == nil && !bytes.Equal(got, buf) {
						err = fmt.Errorf("read back at %d differs from what was written", off)
					}
				}
				l.mu.Lock()
				if err != nil {
					l.errs = append(l.errs, fmt.Errorf("at %d: %w", off, err))
					l.mu.Unlock()
					return
				}
				l.last[off] = append(l.last[off][:0], buf...)
				l.ops++
				l.mu.Unlock()
			}
		}()
	}
	return l
}

// progress is how many writes completed and whether any failed.
func (l *writeLoad) progress() (ops int, failed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ops, len(l.errs) > 0
}

// waitOps returns once n writes completed in all, a writer failed, or 30 s passed.
func (l *writeLoad) waitOps(n int) {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		if ops, failed := l.progress(); ops >= n || failed {
			return
		}
		time.Sleep(10 * time.Millisecond) // polling the writers' progress, not synchronising
	}
}

// finish stops the writers and fails t if any write failed.
func (l *writeLoad) finish(t *testing.T) {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	if len(l.errs) > 0 {
		t.Fatalf("%d requests failed; first: %v", len(l.errs), l.errs[0])
	}
}

// checkBacking fails t unless every block holds the last data written to it on tg's backing file.
func (l *writeLoad) checkBacking(t *testing.T, tg *tgtd.Target) {
	t.Helper()
	for off, want := range l.last {
		got, err := tg.ReadBacking(off, len(want))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("backing file at %d does not hold the last write (%v)", off, err)
		}
	}
}
