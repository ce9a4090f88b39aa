package main

import (
	"errors"
	"testing"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/pool"
)

// TestUblkMaxIO: the per-tag buffers come from the stack's (RDMA-registered) pool and may hold
// at most half of it; a geometry that does not fit gets smaller requests, never a Start that
// waits for ever on a pool at its bound.
func TestUblkMaxIO(t *testing.T) {
	newPool := func(mem int64) *pool.Pool {
		p, err := pool.New(pool.Config{MaxBytes: mem})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	for _, tc := range []struct {
		name    string
		opts    ublkOptions
		want    int
		wantErr error
	}{
		{"no pool: unchanged", ublkOptions{Queues: 4, Depth: 64}, 0, nil},
		{"default buffer-memory fits the defaults", ublkOptions{Queues: 4, Depth: 64, Pool: newPool(512 << 20)}, 0, nil},
		{"explicit size that fits", ublkOptions{Queues: 2, Depth: 32, MaxIO: 1 << 20, Pool: newPool(512 << 20)}, 1 << 20, nil},
		// 64 MiB / 2 / (4 × 64) = 128 KiB
		{"small pool caps the request", ublkOptions{Queues: 4, Depth: 64, Pool: newPool(64 << 20)}, 128 << 10, nil},
		// 64 MiB / 2 / (4 × 96) = 87381 bytes: the largest class that fits is 64 KiB
		{"cap is a power of two", ublkOptions{Queues: 4, Depth: 96, Pool: newPool(64 << 20)}, 64 << 10, nil},
		{"not even 4 KiB per tag", ublkOptions{Queues: 4096, Depth: 4096, Pool: newPool(64 << 20)}, 0, block.ErrInvalid},
		{"beyond the driver", ublkOptions{Queues: 4, Depth: 8192}, 0, block.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ublkMaxIO(tc.opts)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Fatalf("max IO %d, want %d", got, tc.want)
			}
		})
	}
}
