package nbd

import (
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/block"
)

// noMultiConn is a device without MultiConn.
type noMultiConn struct{ *memdev.Device }

func (d noMultiConn) Limits() block.Limits {
	l := d.Device.Limits()
	l.MultiConn = false
	return l
}

func testServer(t *testing.T, dev block.Device) *Server {
	t.Helper()
	srv, err := NewServer(dev, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// A reattached device keeps the timeouts it was attached with: the reconfigure carries them as
// the connect did (a missing NBD_ATTR_TIMEOUT or DEAD_CONN_TIMEOUT would leave the kernel's).
func TestReconfigureAttrsCarryTheTimeouts(t *testing.T) {
	dev, err := memdev.New(1<<20, memdev.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := testServer(t, dev)
	e := reconfigureAttrs(srv, 4, []int{7, 9}, AttachOptions{Timeout: 30 * time.Second, DeadConnTimeout: 2 * time.Minute, BackendID: "iser-blk:gw:t"})
	got := map[uint16][]byte{}
	for _, a := range mustAttrs(t, e.b) {
		got[a.typ] = a.payload
	}
	u64 := func(typ uint16) uint64 { return binary.NativeEndian.Uint64(got[typ]) }
	if binary.NativeEndian.Uint32(got[nbdAttrIndex]) != 4 || u64(nbdAttrTimeout) != 30 || u64(nbdAttrDeadConnTimeout) != 120 {
		t.Fatalf("reconfigure attributes: %v", got)
	}
	if items := mustAttrs(t, got[nbdAttrSockets]); len(items) != 2 {
		t.Fatalf("%d sockets, want 2", len(items))
	}
	if string(got[nbdAttrBackendID]) != "iser-blk:gw:t\x00" {
		t.Fatalf("backend id %q", got[nbdAttrBackendID])
	}
}

// Reattach refuses several connections to a device without multi-conn, as Attach does, before
// touching the kernel.
func TestReattachChecksMultiConn(t *testing.T) {
	dev, err := memdev.New(1<<20, memdev.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := testServer(t, noMultiConn{dev})
	for name, f := range map[string]func(*Server, AttachOptions) (*Attachment, error){"Attach": Attach, "Reattach": Reattach} {
		_, err := f(srv, AttachOptions{Device: "/dev/nbd9", Connections: 4})
		if err == nil || !strings.Contains(err.Error(), "multi-conn") {
			t.Errorf("%s with 4 connections to a device without multi-conn: %v", name, err)
		}
	}
}
