//go:build e2e

package iser

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/test/e2e/tgtd"
)

const e2eInitiator = "iqn.2026-11.io.iser-blk:e2e-device"

// addLUN adds LUN lun of size bytes with the given logical block size to tg (tgtadm
// --blocksize), backed by a sparse file in /dev/shm removed at cleanup.
func addLUN(t *testing.T, tg *tgtd.Target, lun int, size int64, blockSize int) {
	t.Helper()
	f, err := os.CreateTemp("/dev/shm", "iser-blk-e2e-lun-*.img")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(f.Name()) })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := tg.TGTAdm("--mode", "logicalunit", "--op", "new", "--tid", strconv.Itoa(tg.TID), "--lun", strconv.Itoa(lun),
		"--backing-store", f.Name(), "--blocksize", strconv.Itoa(blockSize)); err != nil {
		t.Fatal(err)
	}
}

func openE2E(t *testing.T, url string, opts Options) *Device {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if opts.InitiatorName == "" {
		opts.InitiatorName = e2eInitiator
	}
	opts.Logger = zaptest.NewLogger(t)
	d, err := Open(ctx, url, opts)
	if err != nil {
		t.Fatalf("Open %s: %v", url, err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return d
}

func TestE2EDeviceProbe(t *testing.T) {
	tg := tgtd.Start(t, tgtd.Options{Size: 96 << 20})
	addLUN(t, tg, 2, 40<<20, 4096)
	for _, tc := range []struct {
		lun       int
		size      int64
		blockSize int
	}{{1, 96 << 20, 512}, {2, 40 << 20, 4096}} {
		d := openE2E(t, fmt.Sprintf("iscsi://%s/%s/%d", tg.Portal, tg.Name, tc.lun), Options{})
		info := d.Info()
		t.Logf("LUN %d: %+v", tc.lun, info)
		if d.Size() != tc.size || d.BlockSize() != tc.blockSize || info.Capacity != tc.size || int(info.LogicalBlockSize) != tc.blockSize {
			t.Fatalf("LUN %d: size %d block %d, want %d %d", tc.lun, d.Size(), d.BlockSize(), tc.size, tc.blockSize)
		}
		if info.Vendor == "" || info.Product == "" || info.Serial == "" || info.WWN == "" {
			t.Fatalf("identity missing: %+v", info)
		}
		l := d.Limits()
		if l.MaxTransfer <= 0 || l.MaxTransfer%int64(tc.blockSize) != 0 || !l.MultiConn || !l.CanFlush {
			t.Fatalf("limits %+v", l)
		}
		// I/O in this LUN's block size: FUA write, read back, zeroing, and the alignment check.
		ctx := context.Background()
		data := make([]byte, 1<<20)
		_, _ = rand.NewChaCha8([32]byte{byte(tc.lun)}).Read(data)
		off := int64(3 * tc.blockSize)
		if err := d.WriteAt(ctx, data, off, block.FUA); err != nil {
			t.Fatalf("LUN %d write: %v", tc.lun, err)
		}
		got := make([]byte, len(data))
		if err := d.ReadAt(ctx, got, off); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("LUN %d read back: %v (equal %v)", tc.lun, err, bytes.Equal(got, data))
		}
		if err := d.WriteZeroes(ctx, off, int64(tc.blockSize)*4, 0); err != nil {
			t.Fatalf("LUN %d write zeroes: %v", tc.lun, err)
		}
		if err := d.ReadAt(ctx, got[:tc.blockSize*5], off); err != nil || !bytes.Equal(got[:tc.blockSize*4], make([]byte, tc.blockSize*4)) ||
			!bytes.Equal(got[tc.blockSize*4:tc.blockSize*5], data[tc.blockSize*4:tc.blockSize*5]) {
			t.Fatalf("LUN %d after zeroing: %v", tc.lun, err)
		}
		if tc.blockSize > 512 {
			if err := d.ReadAt(ctx, got[:tc.blockSize], 512); !errors.Is(err, block.ErrInvalid) {
				t.Fatalf("LUN %d: 512-byte offset on a %d-byte LUN: %v", tc.lun, tc.blockSize, err)
			}
		}
	}
	// LUN 0 of tgt is the array controller: not a disk. LUN 9 does not exist.
	ctx := context.Background()
	if _, err := Open(ctx, fmt.Sprintf("iscsi://%s/%s/0", tg.Portal, tg.Name), Options{InitiatorName: e2eInitiator}); !errors.Is(err, ErrNotDisk) {
		t.Fatalf("LUN 0: %v", err)
	}
	if _, err := Open(ctx, fmt.Sprintf("iscsi://%s/%s/9", tg.Portal, tg.Name), Options{InitiatorName: e2eInitiator}); !errors.Is(err, ErrLUNNotFound) {
		t.Fatalf("LUN 9: %v", err)
	}
}

// TestE2EDeviceConcurrentIO writes random data with 64 requests in flight, sizes 4 KiB..4 MiB
// (split by the Device at the LUN's limit), over two sessions, and reads it back byte-exact,
// also cross-checking the target's backing file.
func TestE2EDeviceConcurrentIO(t *testing.T) {
	const size = 256 << 20
	tg := tgtd.Start(t, tgtd.Options{Size: size})
	// tgt reports no MAXIMUM TRANSFER LENGTH, so the second run caps commands at 256 KiB to make
	// the Device split the larger requests into concurrent pieces.
	for _, tc := range []struct {
		sessions    int
		maxTransfer int64
	}{{1, 0}, {2, 256 << 10}} {
		sessions := tc.sessions
		t.Run(fmt.Sprintf("sessions=%d,max=%d", sessions, tc.maxTransfer), func(t *testing.T) {
			d := openE2E(t, fmt.Sprintf("iscsi://%s/%s/1", tg.Portal, tg.Name), Options{Sessions: sessions, MaxTransfer: tc.maxTransfer})
			if tc.maxTransfer != 0 && d.Limits().MaxTransfer != tc.maxTransfer {
				t.Fatalf("max transfer %d, want %d", d.Limits().MaxTransfer, tc.maxTransfer)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			type extent struct {
				off  int64
				data []byte
			}
			// Lay out non-overlapping extents of random sizes covering most of the LUN.
			r := rand.New(rand.NewPCG(uint64(sessions), 42))
			var extents []extent
			for off := int64(0); ; {
				n := int64(4<<10) << r.IntN(11) // 4 KiB .. 4 MiB
				n = min(n, 4<<20)
				if off+n > size {
					break
				}
				data := make([]byte, n)
				var seed [32]byte
				seed[0], seed[1] = byte(len(extents)), byte(len(extents)>>8)
				_, _ = rand.NewChaCha8(seed).Read(data)
				extents = append(extents, extent{off, data})
				off += n
			}
			run := func(f func(e extent) error) error {
				work := make(chan extent)
				errc := make(chan error, 64)
				var wg sync.WaitGroup
				for range 64 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for e := range work {
							if err := f(e); err != nil {
								errc <- err
								return
							}
						}
					}()
				}
				for _, e := range extents {
					select {
					case work <- e:
					case err := <-errc:
						close(work)
						wg.Wait()
						return err
					}
				}
				close(work)
				wg.Wait()
				close(errc)
				return <-errc
			}
			start := time.Now()
			if err := run(func(e extent) error { return d.WriteAt(ctx, e.data, e.off, 0) }); err != nil {
				t.Fatalf("write: %v", err)
			}
			if err := d.Flush(ctx); err != nil {
				t.Fatalf("flush: %v", err)
			}
			if err := run(func(e extent) error {
				got := make([]byte, len(e.data))
				if err := d.ReadAt(ctx, got, e.off); err != nil {
					return err
				}
				if !bytes.Equal(got, e.data) {
					return fmt.Errorf("mismatch at [%d, +%d)", e.off, len(e.data))
				}
				return nil
			}); err != nil {
				t.Fatalf("read: %v", err)
			}
			t.Logf("%d extents, %d MiB written and verified in %v (max transfer %d)", len(extents), size>>20, time.Since(start), d.Limits().MaxTransfer)
			// The target's backing file holds the same bytes.
			for _, e := range extents[:8] {
				b, err := tg.ReadBacking(e.off, len(e.data))
				if err != nil || !bytes.Equal(b, e.data) {
					t.Fatalf("backing file differs at %d: %v", e.off, err)
				}
			}
			// FUA, write-zeroes (WRITE SAME or its emulation) and range checks on the real target.
			if err := d.WriteAt(ctx, bytes.Repeat([]byte{0x5A}, 8192), 0, block.FUA); err != nil {
				t.Fatalf("FUA write: %v", err)
			}
			if err := d.WriteZeroes(ctx, 4096, 1<<20, 0); err != nil {
				t.Fatalf("write zeroes: %v", err)
			}
			got := make([]byte, 8192)
			if err := d.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got[:4096], bytes.Repeat([]byte{0x5A}, 4096)) || !bytes.Equal(got[4096:], make([]byte, 4096)) {
				t.Fatalf("after zeroing: %v", err)
			}
			if err := d.ReadAt(ctx, got, size-4096); !errors.Is(err, block.ErrInvalid) {
				t.Fatalf("read past the end: %v", err)
			}
		})
	}
}

func TestE2EOpenErrors(t *testing.T) {
	tg := tgtd.Start(t, tgtd.Options{CHAP: &tgtd.Account{User: "e2euser", Password: "e2e-secret-123456"}})
	ctx := context.Background()
	base := Options{InitiatorName: e2eInitiator}
	cases := []struct {
		name string
		url  string
		opts Options
		want error
	}{
		{"wrong IQN", fmt.Sprintf("iscsi://%s/iqn.2026-11.io.iser-blk:nope/1", tg.Portal), Options{
			CHAP: &login.CHAP{User: "e2euser", Secret: "e2e-secret-123456"}}, login.ErrTargetNotFound},
		{"closed port", fmt.Sprintf("iscsi://%s/%s/1", tgtd.ClosedPort(t), tg.Name), Options{}, login.ErrPortalUnreachable},
		{"wrong secret", fmt.Sprintf("iscsi://e2euser@%s/%s/1", tg.Portal, tg.Name), Options{
			CHAP: &login.CHAP{Secret: "not-the-secret-1"}}, login.ErrAuthFailed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opts := c.opts
			opts.InitiatorName = base.InitiatorName
			start := time.Now()
			_, err := Open(ctx, c.url, opts)
			if !errors.Is(err, c.want) {
				t.Fatalf("err %v, want %v", err, c.want)
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Fatalf("took %v", el)
			}
		})
	}
	d := openE2E(t, fmt.Sprintf("iscsi://e2euser@%s/%s/1", tg.Portal, tg.Name), Options{CHAP: &login.CHAP{Secret: "e2e-secret-123456"}})
	if d.Size() != 64<<20 {
		t.Fatalf("size %d", d.Size())
	}
}

// TestE2ESubmitWriteMax: against tgtd the device's SubmitWriteMax is the immediate-data limit
// the login negotiated (RFC 7143 §13.11, §13.14: min(FirstBurstLength, the target's
// MaxRecvDataSegmentLength) with ImmediateData=Yes, 0 without), a write of that size is taken
// by SubmitAt and lands, and one block more is declined (it needs an R2T, which only the
// synchronous path serves).
func TestE2ESubmitWriteMax(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params map[string]string
		want   int
	}{
		{"tgt defaults", nil, 8192},
		{"bench-tuned", map[string]string{"MaxRecvDataSegmentLength": "262144", "FirstBurstLength": "262144",
			"MaxBurstLength": "1048576"}, 262144},
		{"no immediate data", map[string]string{"ImmediateData": "No"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tg := tgtd.Start(t, tgtd.Options{Size: 16 << 20, Params: tc.params})
			d := openE2E(t, fmt.Sprintf("iscsi://%s/%s/1", tg.Portal, tg.Name), Options{})
			if got := d.SubmitWriteMax(); got != tc.want {
				t.Fatalf("SubmitWriteMax = %d, want %d", got, tc.want)
			}
			ctx := context.Background()
			done := make(devCompletion, 1)
			if d.SubmitAt(ctx, make([]byte, tc.want+512), 0, true, 0, done) {
				t.Fatalf("a write of %d bytes was submitted over the limit %d", tc.want+512, tc.want)
			}
			if tc.want == 0 {
				return
			}
			data := make([]byte, tc.want)
			_, _ = rand.NewChaCha8([32]byte{9}).Read(data)
			if !d.SubmitAt(ctx, data, 4096, true, 0, done) {
				t.Fatalf("a write of %d bytes (the limit) was declined", tc.want)
			}
			d.Kick()
			if err := done.wait(t); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(data))
			if err := d.ReadAt(ctx, got, 4096); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("read back: %v (equal %v)", err, bytes.Equal(got, data))
			}
		})
	}
}
