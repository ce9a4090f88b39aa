package gateway

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/iser-blk/iser-blk/pool"
)

// nbdFlagReadOnly is NBD_FLAG_READ_ONLY (NBD protocol, "Transmission flags").
const nbdFlagReadOnly = 1 << 1

// TestNBDExportOptions: the payload budget is three quarters of the pool's usable bytes; without
// a pool nbd's heap default applies (no typed nil in the interface) with no budget; the
// description names the target without its password.
func TestNBDExportOptions(t *testing.T) {
	p, err := pool.New(pool.Config{MaxBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	e := &NBDExport{Target: "iscsi://alice:hunter2@127.0.0.1/iqn.2026-12.x:t/0", Pool: p}
	o := e.options()
	if want := p.Stats().MaxBytes * 3 / 4; o.PayloadBudget != want || want == 0 {
		t.Fatalf("PayloadBudget %d, want %d", o.PayloadBudget, want)
	}
	if strings.Contains(o.Description, "hunter2") || !strings.Contains(o.Description, "127.0.0.1/iqn.2026-12.x:t/0") {
		t.Fatalf("description %q", o.Description)
	}
	e.Pool = nil
	if o := e.options(); o.Pool != nil || o.PayloadBudget != 0 {
		t.Fatalf("without a pool: Pool %#v, budget %d", o.Pool, o.PayloadBudget)
	}
}

// TestNBDExportServer: ReadOnly reaches the server's transmission flags.
func TestNBDExportServer(t *testing.T) {
	dev := memDevice(t, 1<<20)
	for _, ro := range []bool{false, true} {
		e := &NBDExport{Name: "disk", Target: "iscsi://user:pw@127.0.0.1/iqn.x/0", ReadOnly: ro, Log: zaptest.NewLogger(t)}
		srv, err := e.Server(dev)
		if err != nil {
			t.Fatal(err)
		}
		if got := srv.Flags()&nbdFlagReadOnly != 0; got != ro {
			t.Fatalf("ReadOnly %v: flags %#x", ro, srv.Flags())
		}
	}
}

// TestNBDExportOnSocket: the export announces its URI, greets a client on the socket (fixed
// newstyle: NBDMAGIC, IHAVEOPT), and stops serving and closes the socket when its context
// ends; a server it cannot build closes the socket it was given.
func TestNBDExportOnSocket(t *testing.T) {
	dev := memDevice(t, 1<<20)
	path := filepath.Join(t.TempDir(), "nbd.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var announced string
	e := &NBDExport{Name: "disk", Log: zaptest.NewLogger(t)}
	exp, err := e.OnSocket(dev, Socket{Listener: l, URI: "nbd+unix:///disk?socket=" + path, Drain: time.Second,
		Announce: func(uri string) { announced = uri }})
	if err != nil {
		t.Fatal(err)
	}
	exp.Announce()
	if announced != "nbd+unix:///disk?socket="+path {
		t.Fatalf("announced %q", announced)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- exp.Serve(ctx) }()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	greeting := make([]byte, 16)
	if _, err := io.ReadFull(c, greeting); err != nil || string(greeting) != "NBDMAGICIHAVEOPT" {
		t.Fatalf("greeting %q, %v", greeting, err)
	}
	c.Close()
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("Serve after the context ended: %v", err)
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		t.Fatal("the socket still accepts after Serve returned")
	}

	badPath := filepath.Join(t.TempDir(), "bad.sock")
	l2, err := net.Listen("unix", badPath)
	if err != nil {
		t.Fatal(err)
	}
	bad := &NBDExport{Name: strings.Repeat("n", 5000), Log: zaptest.NewLogger(t)}
	if _, err := bad.OnSocket(dev, Socket{Listener: l2}); err == nil {
		t.Fatal("an export name over NBD's 4096 bytes was served")
	}
	if _, err := l2.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept on the socket of a failed export: %v, want it closed", err)
	}
	if _, err := os.Stat(badPath); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the socket file of a failed export: %v, want it removed", err)
	}
}

// TestNBDExportStoppedBeforeServing: a context that ended before the server took the listener
// (a stop signal right after ready) still closes it and removes the socket file.
func TestNBDExportStoppedBeforeServing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nbd.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	exp, err := (&NBDExport{}).OnSocket(memDevice(t, 1<<20), Socket{Listener: l, Drain: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := exp.Serve(ctx); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket file after Serve returned: %v, want it removed", err)
	}
}
