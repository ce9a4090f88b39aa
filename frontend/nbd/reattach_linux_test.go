package nbd

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

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

// fakeReconfigure stands in for NBD_CMD_RECONFIGURE: round i (from 0) takes takes[i] of the
// sockets it is given, as the kernel does while that many connections are dead (it holds a
// duplicate of each; the rest it leaves, answering success); with err set it refuses.
type fakeReconfigure struct {
	takes  []int
	rounds int
	held   []*os.File
	err    error
}

func (k *fakeReconfigure) reconfigure(t *testing.T) func([]*os.File) error {
	return func(remotes []*os.File) error {
		defer func() { k.rounds++ }()
		if k.err != nil {
			return k.err
		}
		take := 0
		if k.rounds < len(k.takes) {
			take = min(k.takes[k.rounds], len(remotes))
		}
		for _, r := range remotes[:take] {
			fd, err := unix.FcntlInt(r.Fd(), unix.F_DUPFD_CLOEXEC, 3)
			if err != nil {
				t.Fatal(err)
			}
			k.held = append(k.held, os.NewFile(uintptr(fd), "kernel"))
		}
		return nil
	}
}

func reconnectAttachment(t *testing.T) *Attachment {
	_, srv, _ := intakeConn(t)
	return &Attachment{srv: srv, index: 3, viaNetlink: true, log: zap.NewNop(), done: make(chan struct{})}
}

// The kernel takes a new socket only in place of a connection it saw die and answers success
// when it finds none: reconnect repeats until every socket is taken, and serves exactly those.
func TestReconnectRepeatsUntilTheKernelTakesEverySocket(t *testing.T) {
	a := reconnectAttachment(t)
	k := &fakeReconfigure{takes: []int{0, 1, 0, 1}}
	if err := a.reconnect(2, k.reconfigure(t)); err != nil {
		t.Fatal(err)
	}
	if k.rounds != 4 || len(k.held) != 2 {
		t.Fatalf("%d rounds, %d sockets taken; want 4 rounds and both taken", k.rounds, len(k.held))
	}
	if !a.connected.Load() {
		t.Fatal("not marked connected")
	}
	// what is served are the sockets the kernel holds: when it closes them, the attachment ends
	for _, f := range k.held {
		f.Close()
	}
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the attachment did not end when the kernel closed the sockets it took")
	}
}

func TestReconnectGivesUp(t *testing.T) {
	defer func(d time.Duration) { reconnectFor = d }(reconnectFor)
	reconnectFor = 200 * time.Millisecond
	t.Run("no dead connection", func(t *testing.T) {
		a := reconnectAttachment(t)
		k := &fakeReconfigure{takes: []int{1}}
		err := a.reconnect(2, k.reconfigure(t))
		if !errors.Is(err, ErrNotWaiting) || !strings.Contains(err.Error(), "took 1 of 2") {
			t.Fatalf("reconnect: %v; want ErrNotWaiting, 1 of 2 taken", err)
		}
		wantPeerEOF(t, k.held[0]) // the one taken is closed again: the device waits for a successor
	})
	t.Run("the kernel refuses", func(t *testing.T) {
		a := reconnectAttachment(t)
		k := &fakeReconfigure{err: ErrNotWaiting}
		if err := a.reconnect(1, k.reconfigure(t)); !errors.Is(err, ErrNotWaiting) || k.rounds != 1 {
			t.Fatalf("reconnect: %v after %d rounds; want the refusal at once", err, k.rounds)
		}
	})
}

func wantPeerEOF(t *testing.T, f *os.File) {
	t.Helper()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read %v, want EOF", err)
	}
}
