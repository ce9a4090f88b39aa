package main

import (
	"context"
	"io"
	"path/filepath"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/iser-blk/iser-blk/backend/memdev/memdevtest"
	"github.com/iser-blk/iser-blk/internal/status"
)

// status --check: 0 while the gateway serves, 1 before it does and once it is fenced (or failed,
// or degraded).
func TestStatusCheckExitCode(t *testing.T) {
	dev := memdevtest.New(t, 1<<20)
	sf := &serviceFlags{name: "gw", runDir: filepath.Join(t.TempDir(), "run")}
	ef := &exportFlags{target: "mem://1MiB"}
	ef.cache.Mode = "off"
	g, err := startGateway(sf, identity("gw", "ublk", "", ef), new(status.IOCounters), func() {}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Service().Close() })
	g.Serving(dev, "", status.Frontend{Kind: "ublk"})
	args := []string{"status", "--check", "--run-dir", sf.runDir, "gw"}
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
