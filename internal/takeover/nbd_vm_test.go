//go:build vm

package takeover

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/statefile"
	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// TestVMNBDStateUnrecordableRemovesDevice: a device attach --name created but whose state file
// cannot be written is not served (a successor could not take it over, and nothing would say
// whether its writes were acknowledged): AttachNBD fails and the kernel device is
// disconnected again, not left configured with nobody serving it.
func TestVMNBDStateUnrecordableRemovesDevice(t *testing.T) {
	vmtest.Require(t)
	vmtest.LoadModules(t, "nbd")
	const dev = "/dev/nbd6"
	mem, err := memdev.New(64<<20, memdev.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := nbd.NewServer(mem, nbd.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	// The state file's directory does not exist: statefile.Write cannot create its temporary file.
	tk, err := Prepare(Options{Dir: filepath.Join(t.TempDir(), "gone"), Name: "unrecordable", Kind: modes.NBD,
		CacheMode: modes.Off, Log: zaptest.NewLogger(t),
		LUN: statefile.Identity{Target: "mem://64MiB", Size: mem.Size(), BlockSize: mem.BlockSize()}})
	if err != nil {
		t.Fatal(err)
	}
	a, err := tk.AttachNBD(KernelNBD, srv, nbd.AttachOptions{Device: dev, Connections: 1,
		DeadConnTimeout: 10 * time.Second, Logger: zaptest.NewLogger(t)})
	if err == nil {
		t.Fatalf("attach with an unwritable state file succeeded (%s)", a.Path())
	}
	if !strings.Contains(err.Error(), "state file") {
		t.Errorf("error does not name the state file: %v", err)
	}
	// The kernel drops a disconnected device's capacity and its pid attribute.
	size, err := os.ReadFile("/sys/block/nbd6/size")
	if err != nil {
		t.Fatal(err)
	}
	if s := strings.TrimSpace(string(size)); s != "0" {
		t.Errorf("%s still has %s sectors after the failed attach", dev, s)
	}
	if vmtest.NBDServed("/dev/nbd6") {
		t.Errorf("%s is still connected", dev)
	}
}
