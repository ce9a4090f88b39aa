package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/iser-blk/iser-blk/frontend/ublk"
	"github.com/iser-blk/iser-blk/pool"
)

// TestUblkMaxIOMessage: a --buffer-memory too small for the ublk geometry is refused naming the
// flags to change; one that fits caps the request at what half the pool holds.
func TestUblkMaxIOMessage(t *testing.T) {
	p, err := pool.New(pool.Config{MaxBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	_, err = ublkMaxIO(ublk.Options{Queues: 4096, Depth: 4096, Pool: p}, p)
	want := "ublk: --buffer-memory 64 MiB cannot hold 4096 queues × depth 4096 request buffers of even 4 KiB in half of it: raise --buffer-memory or lower --queues/--depth: "
	if !errors.Is(err, ublk.ErrBadOptions) || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("%v, want %q", err, want)
	}
	if got := exitCode(err); got != exitUsage {
		t.Fatalf("exit %d, want %d (usage)", got, exitUsage)
	}
	if n, err := ublkMaxIO(ublk.Options{Queues: 4, Depth: 64, Pool: p}, p); err != nil || n != 128<<10 {
		t.Fatalf("%d %v, want 128 KiB", n, err)
	}
}

// TestUblkIDUsage: --ublk-id is ublk's (with --nbd it is a usage error, and serve does not know
// it) and must be a device number the driver can give; a valid one reaches ublk.Options.
func TestUblkIDUsage(t *testing.T) {
	for _, tt := range []struct {
		af   attachFlags
		want string
	}{
		{attachFlags{nbdDev: "/dev/nbd0", connections: 1, ublkID: 3}, "--ublk-id needs --ublk"},
		{attachFlags{useUblk: true, connections: 1, ublkID: -2}, "--ublk-id must be 0..1048575"},
		{attachFlags{useUblk: true, connections: 1, ublkID: ublk.MaxID + 1}, "--ublk-id must be 0..1048575"},
	} {
		var ue *usageError
		if err := tt.af.check(); !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: %v, want a usage error with %q", tt.af, err, tt.want)
		}
	}
	for _, args := range [][]string{
		{"attach", "--target", "mem://1MiB", "--nbd", "/dev/nbd0", "--ublk-id", "3"},
		{"attach", "--target", "mem://1MiB", "--ublk", "--ublk-id", "1048576"},
		{"serve", "--target", "mem://1MiB", "--ublk-id", "3"},
	} {
		if code, stdout, _ := runOut(args...); code != exitUsage || stdout != "" {
			t.Errorf("%q: exit %d, stdout %q; want exit 2 and nothing on stdout", args, code, stdout)
		}
	}
	af := attachFlags{useUblk: true, connections: 1, ublkID: 0}
	if err := af.check(); err != nil || af.uo.ID == nil || *af.uo.ID != 0 {
		t.Fatalf("--ublk --ublk-id 0: %v, ID %v; want ID 0", err, af.uo.ID)
	}
	af = attachFlags{useUblk: true, connections: 1, ublkID: -1}
	if err := af.check(); err != nil || af.uo.ID != nil {
		t.Fatalf("--ublk without --ublk-id: %v, ID %v; want none (the driver picks)", err, af.uo.ID)
	}
}
