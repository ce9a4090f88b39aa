package ublk_test

import (
	"errors"
	"testing"

	"github.com/iser-blk/iser-blk/frontend/ublk"
	"github.com/iser-blk/iser-blk/pool"
)

// TestFitMaxIO: the per-tag buffers come from the stack's (RDMA-registered) pool and may hold
// at most their budget of it (here half); a geometry that does not fit gets smaller requests,
// never a Start that waits for ever on a pool at its bound.
func TestFitMaxIO(t *testing.T) {
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
		opts    ublk.Options
		mem     int64 // of the pool, half of it the budget
		want    int
		wantErr error
	}{
		{"no pool: unchanged", ublk.Options{Queues: 4, Depth: 64}, 0, 0, nil},
		{"default buffer-memory fits the defaults", ublk.Options{Queues: 4, Depth: 64}, 512 << 20, 0, nil},
		{"explicit size that fits", ublk.Options{Queues: 2, Depth: 32, MaxIO: 1 << 20}, 512 << 20, 1 << 20, nil},
		// 64 MiB / 2 / (4 × 64) = 128 KiB
		{"small pool caps the request", ublk.Options{Queues: 4, Depth: 64}, 64 << 20, 128 << 10, nil},
		// 64 MiB / 2 / (4 × 96) = 87381 bytes: the largest class that fits is 64 KiB
		{"cap is a power of two", ublk.Options{Queues: 4, Depth: 96}, 64 << 20, 64 << 10, nil},
		{"not even 4 KiB per tag", ublk.Options{Queues: 4096, Depth: 4096}, 64 << 20, 0, ublk.ErrBadOptions},
		{"beyond the driver", ublk.Options{Queues: 4, Depth: 8192}, 0, 0, ublk.ErrBadOptions},
		{"below a page", ublk.Options{Queues: 4, Depth: 64, MaxIO: 1000}, 0, 0, ublk.ErrBadOptions},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.mem > 0 {
				tc.opts.Pool = newPool(tc.mem)
			}
			got, err := ublk.FitMaxIO(tc.opts, tc.mem/2)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Fatalf("max IO %d, want %d", got, tc.want)
			}
		})
	}
	var be *ublk.BudgetError
	if _, err := ublk.FitMaxIO(ublk.Options{Queues: 4096, Depth: 4096, Pool: newPool(64 << 20)}, 32<<20); !errors.As(err, &be) ||
		be.Queues != 4096 || be.Depth != 4096 || be.Budget != 32<<20 {
		t.Fatalf("%v is not the BudgetError of the geometry", err)
	}
}
