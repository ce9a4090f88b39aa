package gateway

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

// TestNBDExportServer: the settings reach the server (read-only is a transmission flag, RFC
// nbd proto.md "Transmission flags": NBD_FLAG_HAS_FLAGS 1, NBD_FLAG_READ_ONLY 2).
func TestNBDExportServer(t *testing.T) {
	dev := memDevice(t, 1<<20)
	for _, ro := range []bool{false, true} {
		e := &NBDExport{Name: "disk", Target: "iscsi://user:pw@127.0.0.1/iqn.x/0", ReadOnly: ro, Log: zaptest.NewLogger(t)}
		srv, err := e.Server(dev)
		if err != nil {
			t.Fatal(err)
		}
		if got := srv.Flags()&2 != 0; got != ro {
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

	l2, err := net.Listen("unix", filepath.Join(t.TempDir(), "bad.sock"))
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
}
