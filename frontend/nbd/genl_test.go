package nbd

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/memdev"
)

func TestConnectAttrsRoundTrip(t *testing.T) {
	dev, err := memdev.New(1<<30, memdev.Options{BlockSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(dev, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := connectAttrs(srv, 3, []int{7, 9, 11}, AttachOptions{Timeout: 30 * time.Second, DeadConnTimeout: time.Minute})
	attrs, err := parseAttrs(b)
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint16][]byte{}
	for _, a := range attrs {
		got[a.typ] = a.payload
	}
	u64 := func(typ uint16) uint64 { return binary.NativeEndian.Uint64(got[typ]) }
	if binary.NativeEndian.Uint32(got[nbdAttrIndex]) != 3 || u64(nbdAttrSizeBytes) != 1<<30 ||
		u64(nbdAttrBlockSizeBytes) != 4096 || u64(nbdAttrTimeout) != 30 || u64(nbdAttrDeadConnTimeout) != 60 {
		t.Errorf("scalar attributes wrong: %v", got)
	}
	flags := u64(nbdAttrServerFlags)
	for _, f := range []uint64{flagHasFlags, flagSendFlush, flagSendFUA, flagSendTrim, flagSendWriteZeroes, FlagCanMultiConn} {
		if flags&f == 0 {
			t.Errorf("server flags %#x lack %#x", flags, f)
		}
	}
	items, err := parseAttrs(got[nbdAttrSockets])
	if err != nil || len(items) != 3 {
		t.Fatalf("socket items %v %v", items, err)
	}
	for i, it := range items {
		inner, err := parseAttrs(it.payload)
		if err != nil || it.typ != nbdSockItem || len(inner) != 1 || inner[0].typ != nbdSockFD {
			t.Fatalf("item %d malformed", i)
		}
		if v, _ := inner[0].u32(); v != uint32(7+2*i) {
			t.Errorf("item %d fd %d", i, v)
		}
	}
	if string(got[nbdAttrBackendID]) != "iser-blk:iser-blk\x00" {
		t.Errorf("backend id %q", got[nbdAttrBackendID])
	}
	// No index attribute when the kernel is to choose.
	for _, a := range mustAttrs(t, connectAttrs(srv, -1, []int{1}, AttachOptions{})) {
		if a.typ == nbdAttrIndex {
			t.Error("index sent for a kernel-chosen device")
		}
	}
}

func mustAttrs(t *testing.T, b []byte) []attribute {
	t.Helper()
	a, err := parseAttrs(b)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestParseMessages(t *testing.T) {
	var e attrEncoder
	e.u32(nbdAttrIndex, 5)
	m1 := genlMessage(30, 0, 9, nbdCmdConnect, 1, e.b)
	ack := make([]byte, 36)
	binary.NativeEndian.PutUint32(ack[0:], 36)
	binary.NativeEndian.PutUint16(ack[4:], nlmsgError)
	binary.NativeEndian.PutUint32(ack[8:], 9)
	msgs, err := parseMessages(append(m1, ack...))
	if err != nil || len(msgs) != 2 {
		t.Fatalf("%d messages, %v", len(msgs), err)
	}
	cmd, attrs, err := genlAttrs(msgs[0].payload)
	if err != nil || cmd != nbdCmdConnect || len(attrs) != 1 {
		t.Fatalf("genl decode: %d %v %v", cmd, attrs, err)
	}
	if v, ok := attrs[0].u32(); !ok || v != 5 {
		t.Errorf("index %d", v)
	}
	if errno, err := nlError(msgs[1].payload); err != nil || errno != 0 {
		t.Errorf("ack: %v %v", errno, err)
	}
	for _, bad := range [][]byte{{1, 2, 3}, {0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}} {
		if _, err := parseMessages(bad); err == nil {
			t.Errorf("accepted %x", bad)
		}
	}
}

func TestParseDeviceIndex(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{{"/dev/nbd0", 0, true}, {"/dev/nbd15", 15, true}, {"", -1, true}, {"/dev/sda", 0, false}, {"/dev/nbd", 0, false}, {"/dev/nbd-1", 0, false}} {
		got, err := parseDeviceIndex(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("%q: %d %v", tc.in, got, err)
		}
	}
}

// FuzzNetlinkAttrs checks the attribute and message parsers on arbitrary bytes: no panic, no read
// outside the input, and every attribute found lies inside it.
func FuzzNetlinkAttrs(f *testing.F) {
	var e attrEncoder
	e.u32(nbdAttrIndex, 1)
	e.nested(nbdAttrSockets, func(s *attrEncoder) { s.nested(nbdSockItem, func(i *attrEncoder) { i.u32(nbdSockFD, 4) }) })
	e.str(ctrlAttrName, "nbd")
	f.Add(e.b)
	f.Add(genlMessage(16, 1, 1, 3, 1, e.b))
	f.Add([]byte{5, 0, 1, 0, 9})
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		attrs, _ := parseAttrs(b)
		total := 0
		for _, a := range attrs {
			total += nlaHdrLen + len(a.payload)
			a.u16()
			a.u32()
			_, _ = parseAttrs(a.payload)
		}
		if total > len(b) {
			t.Fatalf("attributes cover %d bytes of %d", total, len(b))
		}
		msgs, _ := parseMessages(b)
		for _, m := range msgs {
			_, _, _ = genlAttrs(m.payload)
			_, _ = nlError(m.payload)
		}
	})
}
