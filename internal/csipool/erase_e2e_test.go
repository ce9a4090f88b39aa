//go:build e2e

package csipool

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc/codes"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/test/e2e/tgtd"
)

// gatedEraser runs the real eraser once its gate is open, so a test can act while the erase is
// pending.
type gatedEraser struct {
	gate  chan struct{}
	inner Eraser
}

func (g gatedEraser) Erase(ctx context.Context, l LUN) (Erased, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return Erased{}, ctx.Err()
	}
	return g.inner.Erase(ctx, l)
}

// e2eRig is a controller over one tgtd LUN with the real prober and eraser (behind a gate).
type e2eRig struct {
	tg   *tgtd.Target
	lun  LUN
	opts iser.Options
	c    *Controller
	gate chan struct{}
	logs *observer.ObservedLogs
}

func newE2ERig(t *testing.T, size int64) *e2eRig {
	t.Helper()
	r := &e2eRig{tg: tgtd.Start(t, tgtd.Options{Size: size}), gate: make(chan struct{}),
		opts: iser.Options{InitiatorName: "iqn.2026-12.io.iser-blk:e2e-csipool-erase", LoginTimeout: 2 * time.Second}}
	pool, err := ParsePool([]byte(fmt.Sprintf("iscsi://%s/%s/1\n", r.tg.Portal, r.tg.Name)))
	if err != nil {
		t.Fatal(err)
	}
	r.lun = pool[0]
	core, logs := observer.New(zapcore.InfoLevel)
	r.logs = logs
	r.c, err = New(Config{Pool: pool, ClaimsFile: filepath.Join(t.TempDir(), "claims.json"), Logger: zap.New(core),
		Prober: ISERProber{Options: r.opts}, Eraser: gatedEraser{r.gate, ISEREraser{Options: r.opts}}, EraseRetry: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.c.Close() })
	return r
}

// fillLUN writes a recognisable pattern over the whole LUN through its own session, as the
// volume's tenant would, and checks it reached the target's backing file.
func (r *e2eRig) fillLUN(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	d, err := openLUN(ctx, r.opts, r.lun, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	pattern := bytes.Repeat([]byte("tenant A's secret "), int(d.Size())/18+1)[:d.Size()]
	if err := d.WriteAt(ctx, pattern, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if b, err := r.tg.ReadBacking(d.Size()-18, 18); err != nil || !bytes.Equal(b, pattern[len(pattern)-18:]) {
		t.Fatalf("the pattern is not on the target: %q, %v", b, err)
	}
}

// checkZeroes reads the whole LUN back through a fresh session, and the target's backing file.
func (r *e2eRig) checkZeroes(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	d, err := openLUN(ctx, r.opts, r.lun, true)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	buf := make([]byte, d.Size())
	if err := d.ReadAt(ctx, buf, 0); err != nil {
		t.Fatal(err)
	}
	if i := firstNonZero(buf); i >= 0 {
		t.Fatalf("the next claimant reads byte %d = %q of the previous tenant's data", i, buf[i:min(i+18, len(buf))])
	}
	backing, err := r.tg.ReadBacking(0, int(d.Size()))
	if err != nil {
		t.Fatal(err)
	}
	if i := firstNonZero(backing); i >= 0 {
		t.Fatalf("the target's backing file still holds data at byte %d", i)
	}
}

// TestE2EEraseOnDelete: a tenant's data on a tgtd LUN is unreadable after DeleteVolume: the LUN
// is not handed out while its erase is pending, and afterwards a fresh session reads zeroes over
// the whole LUN.
func TestE2EEraseOnDelete(t *testing.T) {
	r := newE2ERig(t, 32<<20)
	ctx := context.Background()
	resp, err := r.c.CreateVolume(ctx, createReq("a", 0, 0, nil))
	if err != nil {
		t.Fatal(err)
	}
	r.fillLUN(t)
	if _, err := r.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond) // CreateVolume waits for the erase
	_, err = r.c.CreateVolume(short, createReq("b", 0, 0, nil))
	cancel()
	wantCode(t, err, codes.ResourceExhausted)
	if c, err := r.c.GetCapacity(ctx, &csi.GetCapacityRequest{}); err != nil || c.GetAvailableCapacity() != 0 {
		t.Fatalf("capacity during the erase: %v, %v; want 0", c, err)
	}
	close(r.gate)
	waitErased(t, r.c, r.lun.Key)
	r.checkZeroes(t)
	done := r.logs.FilterMessage("LUN erased; it is free").All()
	if len(done) != 1 || done[0].ContextMap()["bytes"] != int64(32<<20) {
		t.Fatalf("the erase is not logged with its size: %v", r.logs.All())
	}
	t.Logf("tgtd LUN erased by %v", done[0].ContextMap()["method"])
	if resp, err := r.c.CreateVolume(ctx, createReq("b", 0, 0, nil)); err != nil || resp.GetVolume().GetCapacityBytes() != 32<<20 {
		t.Fatalf("after the erase: %v, %v", resp, err)
	}
}

// TestE2EEraseRetriesWhileTargetDown: the target is down when the volume is deleted; the erase
// fails, is logged and retried, and succeeds once tgtd is back, before the LUN is handed out.
func TestE2EEraseRetriesWhileTargetDown(t *testing.T) {
	r := newE2ERig(t, 16<<20)
	ctx := context.Background()
	resp, err := r.c.CreateVolume(ctx, createReq("a", 0, 0, nil))
	if err != nil {
		t.Fatal(err)
	}
	r.fillLUN(t)
	r.tg.Kill()
	if _, err := r.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	close(r.gate)
	waitLog(t, r.logs, "erasing a returned LUN failed; it stays out of the pool and is tried again")
	_, err = r.c.CreateVolume(ctx, createReq("b", 0, 0, nil))
	wantCode(t, err, codes.ResourceExhausted)
	if err := r.tg.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the erase after the target's restart", func() bool { return !erasingNow(r.c, r.lun.Key) })
	r.checkZeroes(t)
}
