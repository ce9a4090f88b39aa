//go:build e2e

package iser

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
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
	lentBefore := transport.LentSegments()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	load := startWriteLoad(ctx, d, 4, 16, 1<<20, 7, false) // 4 writers, 16 blocks of 1 MiB each
	load.waitOps(40)
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
	before, _ := load.progress()
	load.waitOps(before + 40)
	load.finish(t)
	ops, _ := load.progress()
	st := d.PathStats()[0]
	t.Logf("%d writes, %d lent segments; path downs %d restores %d replayed %d", ops,
		transport.LentSegments()-lentBefore, st.Downs, st.Restores, st.Replayed)
	if ops < before+40 {
		t.Fatalf("only %d writes after the target resumed, want 40", ops-before)
	}
	if transport.LentSegments() == lentBefore {
		t.Fatal("no segment was sent by reference")
	}
	load.checkBacking(t, tg)
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
