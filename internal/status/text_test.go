package status

import (
	"strings"
	"testing"

	"github.com/iser-blk/iser-blk/internal/modes"
)

func TestWriteList(t *testing.T) {
	var b strings.Builder
	err := WriteList(&b, []Gateway{{Name: "nbd0", PID: 42, FrontendPath: "/dev/nbd0",
		Targets: []string{"iscsi://h/iqn/0"}, CacheMode: modes.WriteBack, State: "ready", UptimeSeconds: 3725}}, []string{"stuck"})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME") {
		t.Fatalf("list:\n%s", b.String())
	}
	for _, want := range []string{"nbd0", "42", "/dev/nbd0", "iscsi://h/iqn/0", "writeback", "ready", "1h2m5s"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("line %q lacks %q", lines[1], want)
		}
	}
	if !strings.Contains(lines[2], "stuck") || !strings.Contains(lines[2], "unresponsive") {
		t.Errorf("unresponsive line %q", lines[2])
	}
}

func TestWriteTextShowsEveryPart(t *testing.T) {
	var io IOCounters
	io.Op(OpRead).Observe(4096, 0, false)
	c := Cache{Mode: "writeback", CapacityBytes: 1 << 30, DirtyBytes: 3 << 20, Hits: 1, Misses: 1, LastWriteBackError: "MEDIUM ERROR"}
	c.SetHitRatio()
	st := Status{Version: 1,
		Gateway:  Gateway{Name: "gw", PID: 1, FrontendKind: "ublk", FrontendPath: "/dev/ublkb0", State: "ready"},
		LUN:      &LUN{SizeBytes: 8 << 30, BlockSize: 4096, Vendor: "LIO-ORG", Product: "disk"},
		Frontend: &Frontend{Kind: "ublk", Queues: 2, QueueDepth: 64},
		Cache:    &c,
		Paths: []Path{{Portal: "10.0.0.1:3260", Transport: "tcp", State: "up",
			Negotiated: Negotiated{MaxRecvDataSegmentLengthTarget: 262144, HeaderDigest: "None", DataDigest: "CRC32C"}}},
		RDMA: &RDMA{SendPosts: 7, SendWorkRequests: 21, RecvPosts: 2, RecvWorkRequests: 32, Completions: 40, CompletionEvents: 9},
		IO:   io.IOStatus(),
	}
	var b strings.Builder
	if err := WriteText(&b, st); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"/dev/ublkb0", "8.0 GiB", "LIO-ORG", "2 queues", "3.0 MiB dirty",
		"hit ratio 50.0%", "MEDIUM ERROR", "path 10.0.0.1:3260", "256 KiB", "CRC32C", "io read", "4.0 KiB",
		"21 sends in 7 posts, 32 receives in 2 posts, 40 completions, 9 completion events"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status text lacks %q:\n%s", want, b.String())
		}
	}
}
