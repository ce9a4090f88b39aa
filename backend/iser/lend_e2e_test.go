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

	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
	"github.com/iser-blk/iser-blk/test/e2e/tgtd"
)

// lendParams let tgtd take 256 KiB segments, so that 1 MiB writes go out in segments the TCP
// transport sends by reference (transport.LendMin); with tgtd's default 8 KiB nothing is lent.
var lendParams = map[string]string{"MaxRecvDataSegmentLength": "262144", "FirstBurstLength": "65536",
	"MaxBurstLength": "262144"}

// TestE2ELentWritesSurviveStall: 1 MiB writes from buffers each writer refills as soon as the
// write returns, sent by reference to tgtd, while tgtd is stopped (SIGSTOP) long enough for the
// keepalive to drop the connection, and then resumed with the old connection's commands and data
// still queued for it. Every write completes, every block on the backing file holds the last data
// written to it, and segments were lent. It checks the whole path against a real target; it does
// not force the race the session's lend.go reasons about (a stale command running after the
// re-issue), which the session tests pin.
func TestE2ELentWritesSurviveStall(t *testing.T) {
	tg := tgtd.Start(t, tgtd.Options{Size: 64 << 20, Params: lendParams})
	d := openE2E(t, fmt.Sprintf("iscsi://%s/%s/1", tg.Portal, tg.Name), Options{Recovery: e2eRecovery(-1)})
	const (
		workers = 4
		blocks  = 16 // per worker
		bsz     = 1 << 20
	)
	lentBefore := transport.LentSegments()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var (
		mu   sync.Mutex
		last = map[int64][]byte{}
		errs []error
		ops  int
		wg   sync.WaitGroup
	)
	stop := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			buf := make([]byte, bsz)
			for {
				select {
				case <-stop:
					return
				default:
				}
				off := int64(w*blocks+rng.IntN(blocks)) * bsz
				for i := 0; i < len(buf); i += 8 {
					v := rng.Uint64()
					for j := range 8 {
						buf[i+j] = byte(v >> (8 * j))
					}
				}
				if err := d.WriteAt(ctx, buf, off, 0); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("write at %d: %w", off, err))
					mu.Unlock()
					return
				}
				mu.Lock()
				last[off] = append(last[off][:0], buf...)
				ops++
				mu.Unlock()
			}
		}()
	}
	waitOps := func(n int) {
		deadline := time.Now().Add(30 * time.Second)
		for {
			mu.Lock()
			done, failed := ops, len(errs) > 0
			mu.Unlock()
			if done >= n || failed || time.Now().After(deadline) {
				return
			}
			time.Sleep(10 * time.Millisecond) // polling the writers' progress, not synchronising
		}
	}
	waitOps(40)
	downs := d.PathStats()[0].Downs
	if err := tg.Pause(); err != nil {
		t.Fatal(err)
	}
	// Stopped until the keepalive (1 s NOP interval, 1 s to answer) has dropped the connection.
	deadline := time.Now().Add(20 * time.Second)
	for d.PathStats()[0].Downs == downs && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling the path's state, not synchronising
	}
	dropped := d.PathStats()[0].Downs > downs
	if err := tg.Resume(); err != nil {
		t.Fatal(err)
	}
	if !dropped {
		t.Fatal("the keepalive did not drop the connection to the stopped target within 20 s")
	}
	mu.Lock()
	before := ops
	mu.Unlock()
	waitOps(before + 40)
	close(stop)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d writes failed, first: %v", len(errs), errs[0])
	}
	st := d.PathStats()[0]
	t.Logf("%d writes, %d lent segments; path downs %d restores %d replayed %d", ops,
		transport.LentSegments()-lentBefore, st.Downs, st.Restores, st.Replayed)
	if ops < before+40 {
		t.Fatalf("only %d writes after the target resumed, want 40", ops-before)
	}
	if transport.LentSegments() == lentBefore {
		t.Fatal("no segment was sent by reference")
	}
	for off, want := range last {
		got, err := tg.ReadBacking(off, len(want))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("block at %d does not hold the last data written to it", off)
		}
	}
}

// TestE2ECopyWrites: with Options.CopyWrites nothing is sent by reference, and the data lands.
func TestE2ECopyWrites(t *testing.T) {
	tg := tgtd.Start(t, tgtd.Options{Size: 16 << 20, Params: lendParams})
	for _, copyWrites := range []bool{true, false} {
		d := openE2E(t, fmt.Sprintf("iscsi://%s/%s/1", tg.Portal, tg.Name), Options{CopyWrites: copyWrites})
		before := transport.LentSegments()
		data := make([]byte, 4<<20)
		_, _ = rand.NewChaCha8([32]byte{3}).Read(data)
		if err := d.WriteAt(context.Background(), data, 0, 0); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(data))
		if err := d.ReadAt(context.Background(), got, 0); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("copy=%v: read back: %v (equal %v)", copyWrites, err, bytes.Equal(got, data))
		}
		if lent := transport.LentSegments() - before; (lent == 0) != copyWrites {
			t.Fatalf("copy=%v: %d segments lent", copyWrites, lent)
		}
		d.Close()
	}
}
