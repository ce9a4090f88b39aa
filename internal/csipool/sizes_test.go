package csipool

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/backend/iser/iscsitest"
	"github.com/iser-blk/iser-blk/backend/iser/scsi/scsitest"
)

// TestISERProberReadsSize: the real prober logs in to an in-process iSCSI target and reads the
// LUN's capacity; a CHAP secret meant for the pool's user@ URLs is not offered for a URL without
// a user (the login would be refused as CHAP without a user); a portal nobody listens on is an
// error, not a size.
func TestISERProberReadsSize(t *testing.T) {
	tg, err := iscsitest.Start(scsitest.New(scsitest.Config{BlockSize: 4096, Blocks: 1000}), iscsitest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	pool, err := ParsePool(fmt.Appendf(nil, "%s\niscsi://%s/iqn.2026-12.io.iser-blk:nobody/0\n", tg.URL(0), closed))
	if err != nil {
		t.Fatal(err)
	}
	p := ISERProber{Options: iser.Options{
		InitiatorName: "iqn.2026-12.io.iser-blk:unit-csipool",
		LoginTimeout:  5 * time.Second,
		CHAP:          &iser.CHAP{Secret: "for-the-user-urls"},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	size, err := p.Size(ctx, pool[0])
	if err != nil || size != 4096*1000 {
		t.Fatalf("Size = %d, %v; want %d", size, err, 4096*1000)
	}
	if size, err := p.Size(ctx, pool[1]); err == nil {
		t.Fatalf("a closed portal answered %d bytes", size)
	}
}
