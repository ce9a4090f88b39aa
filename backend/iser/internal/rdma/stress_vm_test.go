//go:build vm && cgo && linux && !nordma

package rdma_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/backend/iser/internal/rdma"
	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// versioned fills (or checks) b, the device bytes at off, with a pattern derived from each 8-byte
// word's offset and the write's version, so a stale block (an older version, or a write that
// never landed) is told apart from the current one. check returns the first bad offset, or -1.
func versioned(b []byte, off int64, ver uint32, check bool) int64 {
	for i := 0; i+8 <= len(b); i += 8 {
		x := uint64(off+int64(i)) ^ uint64(ver)<<44 + 0x9e3779b97f4a7c15
		x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
		x = (x ^ x>>27) * 0x94d049bb133111eb
		x ^= x >> 31
		if check {
			if binary.LittleEndian.Uint64(b[i:]) != x {
				return off + int64(i)
			}
		} else {
			binary.LittleEndian.PutUint64(b[i:], x)
		}
	}
	return -1
}

// TestStressNoLostResponse is the regression test for the lost-response stall seen over iSER
// (an ext4 sync through ublk hung, the reader idle in ReadHeader with commands outstanding). It
// drives a mixed random read/write load for ISER_STRESS_SECONDS (default 30): 64 concurrent
// requests of 4 KiB to 1 MiB (sizes spread over every power of two, so small and large commands
// interleave and 1 MiB requests become two 512 KiB commands: up to 128 commands in flight, the
// whole receive window), each worker on its own slice of the LUN with a version per 4 KiB block,
// so every read is verified against the last write. A response that never arrives shows up
// within the 5 s command timeout as a watchdog warning, an ABORT TASK / LUN RESET or a
// reconnect: the test demands none of them, and data that verifies.
func TestStressNoLostResponse(t *testing.T) {
	vmtest.Require(t)
	seconds := 30
	if v := os.Getenv("ISER_STRESS_SECONDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("ISER_STRESS_SECONDS=%q: want a positive number", v)
		}
		seconds = n
	}
	workers := 64
	if v := os.Getenv("ISER_STRESS_WORKERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("ISER_STRESS_WORKERS=%q: want a positive number", v)
		}
		workers = n
	}
	const (
		blk      = 4096
		maxBlks  = 256 // 1 MiB
		lunMiB   = 128
		minTotal = 500 // fewer I/Os than this in the run proves nothing
	)
	tg := vmtest.StartLIO(t, vmtest.LIOOptions{SizeMiB: lunMiB})
	p := registeredPool(t, 160<<20, 1<<20)

	core, logs := observer.New(zapcore.WarnLevel)
	rec := iser.DefaultRecovery()
	rec.CommandTimeout = 5 * time.Second
	rec.ReplacementTimeout = 30 * time.Second // a failing run ends sooner
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(seconds)*time.Second+5*time.Minute)
	defer cancel()
	before := rdma.Stats()
	opts := iser.Options{InitiatorName: devInitiator, Logger: zap.New(core), Recovery: &rec}
	if v := os.Getenv("ISER_STRESS_MAX_TRANSFER"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("ISER_STRESS_MAX_TRANSFER=%q: want a positive number of bytes", v)
		}
		opts.MaxTransfer = int64(n)
	}
	d, err := iser.Open(ctx, tg.URL("iser"), opts)
	if err != nil {
		t.Fatalf("open %s: %v", tg.URL("iser"), err)
	}
	defer d.Close()
	t.Cleanup(func() {
		if t.Failed() {
			// where the stall was: the queue pairs' states and the kernel's view (LIO, rxe)
			// blocked kernel tasks (LIO, isert, rxe workers) into the kernel log first
			_ = os.WriteFile("/proc/sysrq-trigger", []byte("w"), 0)
			for _, c := range [][]string{{"rdma", "res", "show", "qp"}, {"sh", "-c", "dmesg | grep -v 'speed is unknown'"},
				{"sh", "-c", "grep . /sys/class/infiniband/*/ports/1/hw_counters/*"},
				{"sh", "-c", "grep . /sys/kernel/config/target/iscsi/*/tpgt_1/attrib/default_cmdsn_depth /sys/kernel/config/target/iscsi/*/tpgt_1/param/*Outstanding* 2>&1"}} {
				out, _ := exec.Command(c[0], c[1:]...).CombinedOutput()
				if len(out) > 24000 {
					out = out[len(out)-24000:]
				}
				t.Logf("%s:\n%s", strings.Join(c, " "), out)
			}
		}
	})
	region := d.Size() / int64(workers) / blk * blk
	if region < maxBlks*blk {
		t.Fatalf("LUN of %d bytes is too small for %d workers", d.Size(), workers)
	}

	var (
		ios, bytes, checked atomic.Int64
		mu                  sync.Mutex
		firstErr            error
	)
	deadline := time.Now().Add(time.Duration(seconds) * time.Second)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 0x5eed))
			base := int64(w) * region
			nblk := int(region / blk)
			vers := make([]uint32, nblk) // 0: never written by this run, contents unknown
			next := uint32(0)
			fail := func(err error) {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				cancel()
			}
			for time.Now().Before(deadline) && ctx.Err() == nil {
				n := 1 + r.IntN(1<<r.IntN(9)) // 1..256 blocks, every power of two equally likely
				first := r.IntN(nblk - n + 1)
				off := base + int64(first)*blk
				buf, err := p.Get(ctx, n*blk)
				if err != nil {
					fail(fmt.Errorf("pool: %w", err))
					return
				}
				if r.IntN(2) == 0 {
					next++
					for i := range n {
						versioned(buf[i*blk:(i+1)*blk], off+int64(i)*blk, next, false)
					}
					err = d.WriteAt(ctx, buf, off, 0)
					if err == nil {
						for i := range n {
							vers[first+i] = next
						}
					}
				} else {
					clear(buf)
					err = d.ReadAt(ctx, buf, off)
					for i := 0; err == nil && i < n; i++ {
						if v := vers[first+i]; v != 0 {
							if bad := versioned(buf[i*blk:(i+1)*blk], off+int64(i)*blk, v, true); bad >= 0 {
								err = fmt.Errorf("byte %d differs from version %d written there", bad, v)
							}
							checked.Add(1)
						}
					}
				}
				p.Put(buf)
				if err != nil {
					fail(fmt.Errorf("worker %d [%d,+%d): %w", w, off, n*blk, err))
					return
				}
				ios.Add(1)
				bytes.Add(int64(n * blk))
			}
		}()
	}
	wg.Wait()
	after := rdma.Stats()
	ps := d.PathStats()
	t.Logf("%d workers, max transfer %d: %d I/Os, %d MiB in %d s; %d blocks verified; path %+v; sends %d in %d posts; "+
		"completions recovered by the CQ safety re-poll: %d", workers, d.Limits().MaxTransfer, ios.Load(), bytes.Load()>>20, seconds, checked.Load(), ps,
		after.SendWRs-before.SendWRs, after.SendPosts-before.SendPosts, after.CQEventsMissed-before.CQEventsMissed)
	for _, e := range logs.All() {
		t.Errorf("gateway %s: %s %v", e.Level, e.Message, e.ContextMap())
	}
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	for _, s := range ps {
		if s.Downs != 0 || s.Aborts != 0 || s.LUNResets != 0 || s.Replayed != 0 {
			t.Errorf("path %s: %d downs, %d ABORT TASK escalations, %d LUN resets, %d replayed: a command went unanswered",
				s.Portal, s.Downs, s.Aborts, s.LUNResets, s.Replayed)
		}
	}
	if c := after.Connections - before.Connections; c != 1 {
		t.Errorf("%d connections during the run, want 1 (a reconnect hides a lost response)", c)
	}
	if ios.Load() < minTotal {
		t.Errorf("only %d I/Os in %d s: too few to say anything", ios.Load(), seconds)
	}
}
