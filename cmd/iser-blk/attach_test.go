package main

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/status"
)

// testAttachment is an attach --name gw of a 1 MiB memory LUN, before its device is announced.
func testAttachment(t *testing.T, stop func()) *attachment {
	t.Helper()
	dev, err := memdev.New(1<<20, memdev.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	sf := &serviceFlags{name: "gw", runDir: filepath.Join(t.TempDir(), "run")}
	ef := &exportFlags{target: "mem://1MiB"}
	ef.cache.Mode = "off"
	return &attachment{sf: sf, ef: ef, af: &attachFlags{useUblk: true}, stop: stop, log: zaptest.NewLogger(t),
		dev: dev, counters: new(status.IOCounters)}
}

func named(t *testing.T, at *attachment) {
	t.Helper()
	g, err := startGateway(at.sf, identity("gw", "ublk", "", at.ef), at.counters, at.stop, at.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Service().Close() })
	at.setGateway(g)
}

func withTakeover(t *testing.T, at *attachment, dev block.Device) {
	t.Helper()
	tk, err := prepareTakeover(at.sf, modes.Ublk, at.ef.target, at.ef.cache.Mode, dev, at.log)
	if err != nil {
		t.Fatal(err)
	}
	at.tk = tk
}

func sendSignal(at *attachment) {
	signals, send := context.WithCancel(context.Background())
	send()
	at.stopOnSignal(signals, nil)
}

// The signal watcher stops at once without a gateway, through the gateway with one (which then
// refuses a hand-over), and does nothing once the attach ended.
func TestAttachStopOnSignal(t *testing.T) {
	var stopped atomic.Int32
	at := testAttachment(t, func() { stopped.Add(1) })
	ended := make(chan struct{})
	close(ended)
	at.stopOnSignal(context.Background(), ended)
	if stopped.Load() != 0 {
		t.Fatal("stopped after the attach ended")
	}
	sendSignal(at)
	if stopped.Load() != 1 {
		t.Fatalf("without a gateway: stopped %d times, want 1", stopped.Load())
	}
	at = testAttachment(t, func() { stopped.Add(1) })
	named(t, at)
	sendSignal(at)
	if stopped.Load() != 2 {
		t.Fatalf("with a gateway: stopped %d times in all, want 2", stopped.Load())
	}
	_, err := at.gateway().Restart(context.Background(), control.Request{})
	if err == nil || !strings.Contains(err.Error(), "already stopping") {
		t.Fatalf("restart after the signal: %v", err)
	}
}

// A stop signal before the device is announced keeps the gateway from ever handing the device
// over: a restart could otherwise commit while the stopped frontend tears the device down.
func TestSignalBeforeTheNameKeepsHandOverOff(t *testing.T) {
	for _, sig := range []bool{true, false} {
		at := testAttachment(t, func() {})
		withTakeover(t, at, at.dev)
		if sig {
			sendSignal(at) // no gateway yet: the attach is stopped directly
		}
		named(t, at)
		at.tk.SetCanWait(func() error { return nil })
		at.tk.Serving(at.dev)
		if err := at.tk.Record(modes.Ublk, 3); err != nil {
			t.Fatal(err)
		}
		at.announced("/dev/ublkb3", status.Frontend{Kind: "ublk"})
		_, err := at.gateway().Restart(context.Background(), control.Request{})
		if sig != (err != nil) {
			t.Errorf("signal before the name %v: restart %v", sig, err)
		}
	}
}

// A gateway taking over the device a previous one left is recovering until the device is
// announced; one that takes nothing over stays starting.
func TestTakingOverIsRecovering(t *testing.T) {
	at := testAttachment(t, func() {})
	withTakeover(t, at, at.dev)
	named(t, at)
	at.takingOver()
	if s, _ := at.gateway().State(); s != lifecycle.Starting {
		t.Fatalf("a fresh attach is %s, want starting", s)
	}
	if err := at.tk.Record(modes.Ublk, 2); err != nil {
		t.Fatal(err)
	}
	withTakeover(t, at, at.dev)
	at.takingOver()
	if s, r := at.gateway().State(); s != lifecycle.Recovering || !strings.Contains(r, "ublk device a previous gateway") {
		t.Fatalf("taking over: %s (%q), want recovering", s, r)
	}
	at.announced("/dev/ublkb2", status.Frontend{Kind: "ublk"})
	if s, _ := at.gateway().State(); s != lifecycle.Ready {
		t.Fatalf("after the announce: %s, want ready", s)
	}
}

// status --check: 0 while the gateway serves, 1 before it does and once it is fenced (or failed,
// or degraded).
func TestStatusCheckExitCode(t *testing.T) {
	at := testAttachment(t, func() {})
	named(t, at)
	g := at.gateway()
	g.Serving(at.dev, "", status.Frontend{Kind: "ublk"})
	args := []string{"status", "--check", "--run-dir", at.sf.runDir, "gw"}
	runStatus := func(args []string) int { return run(context.Background(), args, io.Discard, io.Discard) }
	if code := runStatus(args); code != exitFailure {
		t.Fatalf("status --check of a starting gateway: exit %d, want %d", code, exitFailure)
	}
	g.Ready()
	if code := runStatus(args); code != exitOK {
		t.Fatalf("status --check of a ready gateway: exit %d", code)
	}
	g.Fenced("gateway (pid 7) died with dirty pages")
	if code := runStatus(args); code != exitFailure {
		t.Fatalf("status --check of a fenced gateway: exit %d, want %d", code, exitFailure)
	}
	if code := runStatus(append([]string{"status", "--json"}, args[1:]...)); code != exitFailure {
		t.Fatalf("status --json --check of a fenced gateway: exit %d, want %d", code, exitFailure)
	}
}
