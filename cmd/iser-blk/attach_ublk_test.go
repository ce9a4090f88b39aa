package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/iser-blk/iser-blk/block"
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
	if !errors.Is(err, block.ErrInvalid) || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("%v, want %q", err, want)
	}
	if n, err := ublkMaxIO(ublk.Options{Queues: 4, Depth: 64, Pool: p}, p); err != nil || n != 128<<10 {
		t.Fatalf("%d %v, want 128 KiB", n, err)
	}
}
