//go:build e2e

package service_test

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/status"
	"github.com/iser-blk/iser-blk/test/e2e/gateway"
	"github.com/iser-blk/iser-blk/test/e2e/tgtd"
)

// waitStatus polls name's status until cond holds, failing the test after timeout.
func (f *fleet) waitStatus(name, what string, timeout time.Duration, cond func(status.Status) bool) status.Status {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		st := f.status(name)
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%s: not within %v; last status %+v", what, timeout, st.Gateway)
		}
		<-tick.C
	}
}

// dirty writes 1 MiB of 0x5a in 4 KiB writes, which stay in the cache (fio sends no FLUSH).
func (f *fleet) dirty(g *gateway.Server, name string) {
	f.t.Helper()
	if out, err := exec.Command("fio", "--name=w", "--ioengine=nbd", "--uri="+g.URI, "--rw=write", "--bs=4k",
		"--size=1m", "--buffer_pattern=0x5a").CombinedOutput(); err != nil {
		f.t.Fatalf("fio: %v %s", err, out)
	}
	if d := f.status(name).Cache.DirtyBytes; d == 0 {
		f.t.Fatal("no dirty data after the writes: the cache wrote them back already")
	}
}

func checkBacking(t *testing.T, tg *tgtd.Target) {
	t.Helper()
	got, err := tg.ReadBacking(0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{0x5a}, 1<<20)) {
		t.Fatal("the backing file does not hold the data written before the detach")
	}
}

// TestServiceNopRoundTrip: after a keepalive interval on an idle connection, status shows the
// path's NOP-Out round trip (it was always zero before).
func TestServiceNopRoundTrip(t *testing.T) {
	f := newFleet(t)
	f.serve("nop", "--noop-interval", "200ms")
	st := f.waitStatus("nop", "a NOP round trip in status", 20*time.Second, func(st status.Status) bool {
		return len(st.Paths) == 1 && st.Paths[0].NopRoundTrip.Samples > 0
	})
	rtt := st.Paths[0].NopRoundTrip
	if rtt.LastSeconds <= 0 || rtt.MeanSeconds <= 0 || rtt.LastSeconds > 5 || rtt.MeanSeconds > 5 {
		t.Fatalf("nop_round_trip %+v: want last and mean above 0 and within the 5 s ping timeout", rtt)
	}
}

// TestServiceFailedWhileNoPath: with the target gone past the replacement timeout the gateway is
// failed (state and reason in status and list), and ready again once the target is back.
func TestServiceFailedWhileNoPath(t *testing.T) {
	f := newFleet(t)
	_, tg := f.serve("np", "--replacement-timeout", "1s", "--noop-interval", "200ms", "--noop-timeout", "500ms")
	f.waitStatus("np", "ready", 10*time.Second, func(st status.Status) bool { return st.Gateway.State == "ready" })
	tg.Kill()
	st := f.waitStatus("np", "failed once the replacement timeout passed", 30*time.Second,
		func(st status.Status) bool { return st.Gateway.State == "failed" })
	if !strings.Contains(st.Gateway.StateReason, "replacement timeout") {
		t.Errorf("failed with reason %q, want the replacement timeout named", st.Gateway.StateReason)
	}
	if gs := f.list(); len(gs) != 1 || gs[0].State != "failed" {
		t.Errorf("list --json: %+v, want np failed", gs)
	}
	if out, code := f.cli("list"); code != 0 || !strings.Contains(out, "failed") {
		t.Errorf("list: exit %d\n%s", code, out)
	}
	if err := tg.Restart(); err != nil {
		t.Fatal(err)
	}
	st = f.waitStatus("np", "ready once the target is back", 30*time.Second,
		func(st status.Status) bool { return st.Gateway.State == "ready" })
	if st.Paths[0].State != "up" {
		t.Fatalf("ready with path %+v", st.Paths[0])
	}
}

// TestServiceDetachRefusedWhileStopping: a detach that arrives while SIGTERM's final flush is
// running (here: waiting for a target that is gone) is refused at once instead of flushing too;
// the shutdown then finishes by itself once the target is back.
func TestServiceDetachRefusedWhileStopping(t *testing.T) {
	f := newFleet(t)
	g, tg := f.serve("st")
	f.dirty(g, "st")
	tg.Kill()
	g.Signal(t, syscall.SIGTERM)
	g.WaitLog(t, "flushing dirty data to the target", 1, 10*time.Second)
	start := time.Now()
	_, code := f.cli("detach", "st")
	if code != 1 || time.Since(start) > 10*time.Second {
		t.Fatalf("detach during the shutdown's flush: exit %d after %v, want 1 at once", code, time.Since(start))
	}
	if err := tg.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := g.Wait(t, 2*time.Minute); err != nil {
		t.Fatalf("gateway exited with %v", err)
	}
	if n := len(g.LogLines("flushing dirty data to the target")); n != 1 {
		t.Errorf("%d flushes began, want the shutdown's only", n)
	}
	checkBacking(t, tg)
}

// TestServiceSignalDuringDetachJoins: SIGTERM while a detach's write-back waits for the target
// cancels that write-back; the shutdown's final flush takes over and its outcome answers the
// detach, which exits 0 once the target is back.
func TestServiceSignalDuringDetachJoins(t *testing.T) {
	f := newFleet(t)
	g, tg := f.serve("jn")
	f.dirty(g, "jn")
	tg.Kill()
	detach := exec.Command(gateway.Binary(t), "detach", "jn", "--run-dir", f.runDir)
	var stderr bytes.Buffer
	detach.Stderr = &stderr
	if err := detach.Start(); err != nil {
		t.Fatal(err)
	}
	g.WaitLog(t, "flushing dirty data to the target", 1, 10*time.Second)
	g.Signal(t, syscall.SIGTERM)
	g.WaitLog(t, "shutting down", 1, 10*time.Second)
	if err := tg.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := g.Wait(t, 2*time.Minute); err != nil {
		t.Fatalf("gateway exited with %v", err)
	}
	if err := detach.Wait(); err != nil {
		t.Fatalf("detach joined to the shutdown: %v\n%s", err, stderr.String())
	}
	checkBacking(t, tg)
}

// TestServiceDetachClientHangsUp: a client that hangs up during its detach does not hold the
// gateway: the detach completes, the data is written back, and the gateway exits promptly
// (it used to wait up to 10 s for a reply nobody would read).
func TestServiceDetachClientHangsUp(t *testing.T) {
	f := newFleet(t)
	g, tg := f.serve("hu")
	f.dirty(g, "hu")
	c, err := control.Dial(t.Context(), f.runDir, "hu")
	if err != nil {
		t.Fatal(err)
	}
	ctx, hangUp := context.WithCancel(t.Context())
	defer hangUp()
	_, err = c.Detach(ctx, control.DetachOptions{}, func(control.Progress) { hangUp() })
	if err == nil {
		t.Fatal("the detach finished before its first progress line: nothing was left to hang up on")
	}
	hungUp := time.Now()
	if err := g.Wait(t, time.Minute); err != nil {
		t.Fatalf("gateway exited with %v", err)
	}
	if took := time.Since(hungUp); took > 5*time.Second {
		t.Errorf("the gateway exited %v after its detach's client hung up; it waited for a reply nobody reads", took)
	}
	checkBacking(t, tg)
}
