package iser

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/backend/iser/scsi/scsitest"
	"github.com/iser-blk/iser-blk/block"
)

// fastRetry makes back-off instantaneous so retry tests do not wait.
func fastRetry() *scsi.RetryPolicy {
	return &scsi.RetryPolicy{Sleep: func(ctx context.Context, d time.Duration) error { return ctx.Err() }}
}

func open(t testing.TB, cfg scsitest.Config) (*Device, *scsitest.LUN) {
	t.Helper()
	return openWith(t, cfg, func(lun *scsitest.LUN) *scsitest.LUN { return lun })
}

// openWith opens a Device with instant retries on one path: the executor wrap makes of a
// scsitest LUN built from cfg, with its op log on and emptied of what opening sent, so opsWith
// sees only the test's own commands. The device closes with the test.
func openWith[E scsi.Executor](t testing.TB, cfg scsitest.Config, wrap func(*scsitest.LUN) E) (*Device, E) {
	t.Helper()
	cfg.Log = true
	lun := scsitest.New(cfg)
	ex := wrap(lun)
	d, err := NewDevice(context.Background(), []scsi.Executor{ex}, cfg.LUN, Options{Retry: fastRetry()}, nil)
	if err != nil {
		t.Fatalf("NewDevice: %v", err)
	}
	lun.ResetOps()
	t.Cleanup(func() { d.Close() })
	return d, ex
}

func opsWith(lun *scsitest.LUN, opcodes ...byte) []scsitest.Op {
	var out []scsitest.Op
	for _, op := range lun.Ops() {
		for _, c := range opcodes {
			if op.Opcode == c {
				out = append(out, op)
			}
		}
	}
	return out
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	var seed [32]byte
	seed[0], seed[1], seed[2] = byte(n), byte(n>>8), byte(n>>16)
	_, _ = rand.NewChaCha8(seed).Read(b)
	return b
}

func TestProbeLimits(t *testing.T) {
	tests := []struct {
		name  string
		cfg   scsitest.Config
		check func(t *testing.T, l block.Limits, info Info)
	}{
		{"defaults", scsitest.Config{}, func(t *testing.T, l block.Limits, info Info) {
			want := block.Limits{LogicalBlockSize: 512, PhysicalBlockSize: 512, MaxTransfer: defaultMaxTransfer,
				CanFlush: true, CanWriteZeroes: true, CanFastZero: true, MaxWriteZeroes: defaultMaxWriteSameBlocks * 512, MultiConn: true}
			if l != want {
				t.Errorf("limits\n got %+v\nwant %+v", l, want)
			}
			if info.Vendor != "ISERTEST" || info.Product != "FAKE LUN" || info.Revision != "0001" || info.Serial != "fake0001" ||
				info.WWN != "naa.60014050deadbeef0000000000000001" || info.Capacity != 64<<20 || info.WriteSame != "yes" {
				t.Errorf("info %+v", info)
			}
		}},
		{"4k thin array", scsitest.Config{BlockSize: 4096, Blocks: 1 << 20, PhysBlockExponent: 0, Thin: true, LBPU: true, LBPWS: true,
			LBPRZ: true, DPOFUA: true, WCE: true, MaxTransferBlocks: 256, OptimalTransferBlocks: 64, MaxUnmapLBACount: 8192,
			UnmapGranularity: 4, MaxWriteSameBlocks: 4096},
			func(t *testing.T, l block.Limits, info Info) {
				want := block.Limits{LogicalBlockSize: 4096, PhysicalBlockSize: 4096, MaxTransfer: 1 << 20, OptimalTransfer: 256 << 10,
					MaxDiscard: 32 << 20, MaxWriteZeroes: 16 << 20, DiscardAlignment: 16 << 10, VolatileCache: true, CanFlush: true,
					CanFUA: true, CanDiscard: true, CanWriteZeroes: true, CanFastZero: true, DiscardZeroes: true, MultiConn: true}
				if l != want {
					t.Errorf("limits\n got %+v\nwant %+v", l, want)
				}
				if !info.ThinProvisioned || !info.WriteCache || !info.FUA || info.Capacity != 4<<30 {
					t.Errorf("info %+v", info)
				}
			}},
		{"read-only 512e rotating", scsitest.Config{ReadOnly: true, PhysBlockExponent: 3, RotationRate: 7200}, func(t *testing.T, l block.Limits, info Info) {
			if !l.ReadOnly || !info.ReadOnly || l.PhysicalBlockSize != 4096 || !l.Rotational || !info.Rotational {
				t.Errorf("limits %+v", l)
			}
		}},
		{"legacy target", scsitest.Config{NoReadCapacity16: true, No16ByteRW: true, NoModeSense: true, NoBlockLimitsVPD: true,
			NoLBPVPD: true, NoRSOC: true, NoWriteSame: true},
			func(t *testing.T, l block.Limits, info Info) {
				if l.MaxTransfer != defaultMaxTransfer || !l.VolatileCache || l.CanFUA || l.CanDiscard || !l.CanFastZero {
					t.Errorf("limits %+v", l)
				}
				if info.WriteCacheKnown || info.WriteSame != "unknown" {
					t.Errorf("info %+v", info)
				}
			}},
		{"no write same per RSOC", scsitest.Config{NoWriteSame: true}, func(t *testing.T, l block.Limits, info Info) {
			if l.CanFastZero || info.WriteSame != "no" || l.MaxWriteZeroes != l.MaxTransfer {
				t.Errorf("limits %+v info %+v", l, info)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, _ := open(t, tt.cfg)
			if d.Size() != d.Info().Capacity || d.BlockSize() != int(d.Limits().LogicalBlockSize) {
				t.Fatalf("size %d bs %d vs info %+v", d.Size(), d.BlockSize(), d.Info())
			}
			tt.check(t, d.Limits(), d.Info())
		})
	}
}

func TestProbeFailures(t *testing.T) {
	tests := []struct {
		name   string
		cfg    scsitest.Config
		faults []scsitest.Fault
		want   error
	}{
		{"LUN not supported", scsitest.Config{}, []scsitest.Fault{{Opcode: scsi.OpInquiry, Key: scsi.KeyIllegalRequest, ASC: 0x25}}, ErrLUNNotFound},
		{"controller LUN", scsitest.Config{DeviceType: scsi.TypeController}, nil, ErrNotDisk},
		{"not ready", scsitest.Config{}, []scsitest.Fault{{Opcode: scsi.OpTestUnitReady, Key: scsi.KeyNotReady, ASC: 0x3A}}, block.ErrIO},
		{"transport dies", scsitest.Config{}, []scsitest.Fault{{Opcode: -1, Err: errors.New("connection reset")}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lun := scsitest.New(tt.cfg)
			for _, f := range tt.faults {
				lun.InjectFault(f)
			}
			_, err := NewDevice(context.Background(), []scsi.Executor{lun}, 0, Options{Retry: fastRetry()}, nil)
			if err == nil || (tt.want != nil && !errors.Is(err, tt.want)) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
	// Pending UNIT ATTENTIONs (power on, capacity changed) are consumed by the retry policy.
	lun := scsitest.New(scsitest.Config{})
	lun.SetUnitAttention(0x29, 0)
	lun.SetUnitAttention(0x2A, 0x09)
	core, logs := observer.New(zap.InfoLevel)
	if _, err := NewDevice(context.Background(), []scsi.Executor{lun}, 0, Options{Logger: zap.New(core)}, nil); err != nil {
		t.Fatalf("UA not retried: %v", err)
	}
	// Each UNIT ATTENTION is logged with its decoded sense; the power-on one every new nexus
	// sees is informational, anything else is a warning.
	uas := logs.FilterMessage("unit attention").All()
	if len(uas) != 2 || uas[0].Level != zap.InfoLevel || uas[1].Level != zap.WarnLevel ||
		!strings.Contains(uas[1].ContextMap()["error"].(string), "capacity data has changed") {
		t.Fatalf("unit attention logs: %+v", uas)
	}
}

func TestReadWriteSplitting(t *testing.T) {
	for _, bs := range []uint32{512, 4096} {
		t.Run(fmt.Sprint(bs), func(t *testing.T) {
			d, lun := open(t, scsitest.Config{BlockSize: bs, Blocks: (16 << 20) / uint64(bs), MaxTransferBlocks: 64 << 10 / bs})
			maxBytes := int64(64 << 10)
			for _, n := range []int{int(bs), 64 << 10, 64<<10 + int(bs), 1 << 20, 3<<20 + 5*int(bs)} {
				off := int64(bs) * 3
				data := randBytes(n)
				lun.ResetOps()
				if err := d.WriteAt(context.Background(), data, off, 0); err != nil {
					t.Fatalf("write %d: %v", n, err)
				}
				got := make([]byte, n)
				if err := d.ReadAt(context.Background(), got, off); err != nil {
					t.Fatalf("read %d: %v", n, err)
				}
				if !bytes.Equal(got, data) || !bytes.Equal(lun.Bytes(off, int64(n)), data) {
					t.Fatalf("%d bytes: data mismatch", n)
				}
				wantPieces := int((int64(n) + maxBytes - 1) / maxBytes)
				writes := opsWith(lun, scsi.OpWrite16)
				reads := opsWith(lun, scsi.OpRead16)
				if len(writes) != wantPieces || len(reads) != wantPieces {
					t.Fatalf("%d bytes: %d writes %d reads, want %d each", n, len(writes), len(reads), wantPieces)
				}
				covered := map[uint64]bool{}
				for _, op := range append(writes, reads...) {
					if op.Blocks*uint64(bs) > uint64(maxBytes) || op.Status != scsi.StatusGood {
						t.Fatalf("piece %+v exceeds the limit or failed", op)
					}
					for b := range op.Blocks {
						covered[op.LBA+b] = true
					}
				}
				if len(covered) != n/int(bs) {
					t.Fatalf("pieces cover %d blocks, want %d", len(covered), n/int(bs))
				}
			}
		})
	}
}

// barrier holds commands in the fake until want of them are in flight at once, proving the
// pieces of one request run concurrently. It fails (instead of hanging) after a timeout.
func barrier(want int64) func(ctx context.Context, cmd *scsi.Command) error {
	var n atomic.Int64
	release := make(chan struct{})
	var once sync.Once
	return func(ctx context.Context, cmd *scsi.Command) error {
		if cmd.CDB[0] != scsi.OpRead16 && cmd.CDB[0] != scsi.OpWrite16 {
			return nil
		}
		if n.Add(1) >= want {
			once.Do(func() { close(release) })
		}
		select {
		case <-release:
			return nil
		case <-time.After(10 * time.Second):
			return errors.New("barrier: pieces were not in flight together")
		}
	}
}

func TestSplitPiecesRunConcurrently(t *testing.T) {
	d, lun := open(t, scsitest.Config{MaxTransferBlocks: 8})
	lun.Hook = barrier(8)
	buf := make([]byte, 8*8*512)
	if err := d.ReadAt(context.Background(), buf, 0); err != nil {
		t.Fatal(err)
	}
	if m := lun.MaxInflight(); m < 8 {
		t.Fatalf("max in flight %d, want 8", m)
	}
}

func TestMultiSessionSpread(t *testing.T) {
	lun := scsitest.New(scsitest.Config{MaxTransferBlocks: 8})
	var counts [3]atomic.Int64
	var execs []scsi.Executor
	for i := range counts {
		execs = append(execs, countingExec{lun, &counts[i]})
	}
	d, err := NewDevice(context.Background(), execs, 0, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range counts {
		counts[i].Store(0)
	}
	lun.Hook = barrier(12)
	if err := d.WriteAt(context.Background(), randBytes(12*8*512), 0, 0); err != nil {
		t.Fatal(err)
	}
	// With 12 commands held in flight together, least-outstanding gives each session 4.
	for i := range counts {
		if c := counts[i].Load(); c != 4 {
			t.Fatalf("session %d ran %d commands, want 4 (counts %d %d %d)", i, c, counts[0].Load(), counts[1].Load(), counts[2].Load())
		}
	}
}

type countingExec struct {
	ex scsi.Executor
	n  *atomic.Int64
}

func (c countingExec) Execute(ctx context.Context, cmd *scsi.Command, resp *scsi.Response) error {
	c.n.Add(1)
	return c.ex.Execute(ctx, cmd, resp)
}

func TestFUA(t *testing.T) {
	tests := []struct {
		name      string
		cfg       scsitest.Config
		wantFUA   bool
		wantSyncs int
	}{
		{"native", scsitest.Config{DPOFUA: true, WCE: true}, true, 0},
		{"emulated with cache", scsitest.Config{WCE: true}, false, 1},
		{"no cache needs no sync", scsitest.Config{}, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, lun := open(t, tt.cfg)
			if err := d.WriteAt(context.Background(), randBytes(4096), 8192, block.FUA); err != nil {
				t.Fatal(err)
			}
			ops := lun.Ops()
			if len(ops) != 1+tt.wantSyncs || ops[0].Opcode != scsi.OpWrite16 || ops[0].FUA != tt.wantFUA {
				t.Fatalf("ops %+v", ops)
			}
			if tt.wantSyncs == 1 && (ops[1].Opcode != scsi.OpSynchronizeCache16 || ops[1].LBA != 16 || ops[1].Blocks != 8) {
				t.Fatalf("sync %+v, want LBA 16 blocks 8", ops[1])
			}
			lun.ResetOps()
			if err := d.WriteAt(context.Background(), randBytes(512), 0, 0); err != nil || len(lun.Ops()) != 1 || lun.Ops()[0].FUA {
				t.Fatalf("plain write: %v %+v", err, lun.Ops())
			}
		})
	}
}

func TestFlush(t *testing.T) {
	d, lun := open(t, scsitest.Config{WCE: true})
	if err := d.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A target that rejects SYNCHRONIZE CACHE(16) gets (10) from then on.
	lun.InjectFault(scsitest.Fault{Opcode: scsi.OpSynchronizeCache16, Key: scsi.KeyIllegalRequest, ASC: 0x20})
	if err := d.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for _, op := range lun.Ops() {
		got = append(got, op.Opcode)
	}
	if !bytes.Equal(got, []byte{0x91, 0x91, 0x35, 0x35}) {
		t.Fatalf("flush ops % x", got)
	}
}

func TestWriteZeroes(t *testing.T) {
	tests := []struct {
		name      string
		cfg       scsitest.Config
		flags     block.ZeroFlags
		wantErr   error
		wantOp    byte
		wantUnmap bool
		wantNDOB  bool
		wantOps   int
	}{
		{"write same ndob", scsitest.Config{MaxWriteSameBlocks: 1024}, 0, nil, scsi.OpWriteSame16, false, true, 4},
		{"write same without ndob", scsitest.Config{NoNDOB: true, MaxWriteSameBlocks: 1024}, 0, nil, scsi.OpWriteSame16, false, false, 4},
		{"unmap when it reads zeroes", scsitest.Config{LBPWS: true, LBPRZ: true, Thin: true}, 0, nil, scsi.OpWriteSame16, true, true, 1},
		{"no unmap with NoHole", scsitest.Config{LBPWS: true, LBPRZ: true, Thin: true}, block.NoHole, nil, scsi.OpWriteSame16, false, true, 1},
		{"no unmap without LBPRZ", scsitest.Config{LBPWS: true, Thin: true}, 0, nil, scsi.OpWriteSame16, false, true, 1},
		{"emulated", scsitest.Config{NoWriteSame: true, MaxTransferBlocks: 1024}, 0, nil, scsi.OpWrite16, false, false, 4},
		{"emulated after trying", scsitest.Config{NoWriteSame: true, NoRSOC: true, MaxTransferBlocks: 1024}, 0, nil, scsi.OpWrite16, false, false, 4},
		{"fast only refused", scsitest.Config{NoWriteSame: true}, block.FastOnly, block.ErrNotSupported, 0, false, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, lun := open(t, tt.cfg)
			const off, n = 512 * 100, 4096 * 512
			if err := d.WriteAt(context.Background(), bytes.Repeat([]byte{0xAB}, n+1024), off-512, 0); err != nil {
				t.Fatal(err)
			}
			lun.ResetOps()
			err := d.WriteZeroes(context.Background(), off, n, tt.flags)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := lun.Bytes(off-512, n+1024)
			if !bytes.Equal(got[512:512+n], make([]byte, n)) {
				t.Fatal("range does not read back as zeroes")
			}
			if !bytes.Equal(got[:512], bytes.Repeat([]byte{0xAB}, 512)) || !bytes.Equal(got[512+n:], bytes.Repeat([]byte{0xAB}, 512)) {
				t.Fatal("zeroing spilled outside the range")
			}
			ops := opsWith(lun, tt.wantOp)
			if len(ops) != tt.wantOps {
				t.Fatalf("%d ops of 0x%02x, want %d: %+v", len(ops), tt.wantOp, tt.wantOps, lun.Ops())
			}
			for _, op := range ops {
				if op.Unmap != tt.wantUnmap || op.NDOB != tt.wantNDOB || op.Status != scsi.StatusGood {
					t.Fatalf("op %+v: want unmap %v ndob %v", op, tt.wantUnmap, tt.wantNDOB)
				}
			}
		})
	}
}

func TestDiscard(t *testing.T) {
	d, lun := open(t, scsitest.Config{Thin: true, LBPU: true, LBPRZ: true, MaxUnmapLBACount: 1000, MaxUnmapDescriptors: 1})
	if !d.Limits().CanDiscard || !d.Limits().DiscardZeroes {
		t.Fatalf("limits %+v", d.Limits())
	}
	if err := d.WriteAt(context.Background(), bytes.Repeat([]byte{1}, 3000*512), 0, 0); err != nil {
		t.Fatal(err)
	}
	lun.ResetOps()
	if err := d.Discard(context.Background(), 512, 2500*512); err != nil {
		t.Fatal(err)
	}
	ops := opsWith(lun, scsi.OpUnmap)
	var total uint64
	for _, op := range ops {
		if op.Blocks > 1000 || op.Status != scsi.StatusGood {
			t.Fatalf("unmap %+v", op)
		}
		total += op.Blocks
	}
	if len(ops) != 3 || total != 2500 {
		t.Fatalf("%d unmaps covering %d blocks", len(ops), total)
	}
	got := lun.Bytes(0, 3000*512)
	if got[0] != 1 || !bytes.Equal(got[512:2501*512], make([]byte, 2500*512)) || got[2501*512] != 1 {
		t.Fatal("discarded range wrong")
	}

	// WRITE SAME with UNMAP when UNMAP itself is missing.
	d2, lun2 := open(t, scsitest.Config{Thin: true, LBPWS: true})
	if err := d2.Discard(context.Background(), 0, 4096); err != nil {
		t.Fatal(err)
	}
	if ops := lun2.Ops(); len(ops) != 1 || ops[0].Opcode != scsi.OpWriteSame16 || !ops[0].Unmap {
		t.Fatalf("ops %+v", ops)
	}

	// LBPU but a Block Limits page with MAXIMUM UNMAP LBA COUNT 0: UNMAP is not really there;
	// WRITE SAME with UNMAP is used instead.
	lun4 := scsitest.New(scsitest.Config{Thin: true, LBPU: true, LBPWS: true, Log: true})
	d4, err := NewDevice(context.Background(), []scsi.Executor{zeroUnmapLimits{lun4}}, 0, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	lun4.ResetOps()
	if err := d4.Discard(context.Background(), 0, 4096); err != nil {
		t.Fatal(err)
	}
	if ops := lun4.Ops(); len(ops) != 1 || ops[0].Opcode != scsi.OpWriteSame16 || !ops[0].Unmap || d4.Info().UnmapSupported {
		t.Fatalf("ops %+v", ops)
	}

	d3, lun3 := open(t, scsitest.Config{})
	if err := d3.Discard(context.Background(), 0, 4096); !errors.Is(err, block.ErrNotSupported) || len(lun3.Ops()) != 0 {
		t.Fatalf("discard without LBP: %v, %d ops", err, len(lun3.Ops()))
	}
}

func TestRangeChecksSendNothing(t *testing.T) {
	d, lun := open(t, scsitest.Config{Blocks: 1024})
	ctx := context.Background()
	size := d.Size()
	cases := []struct {
		name string
		call func() error
	}{
		{"read misaligned", func() error { return d.ReadAt(ctx, make([]byte, 512), 100) }},
		{"read odd length", func() error { return d.ReadAt(ctx, make([]byte, 100), 0) }},
		{"read past end", func() error { return d.ReadAt(ctx, make([]byte, 1024), size-512) }},
		{"read negative", func() error { return d.ReadAt(ctx, make([]byte, 512), -512) }},
		{"write past end", func() error { return d.WriteAt(ctx, make([]byte, 512), size, 0) }},
		{"zeroes past end", func() error { return d.WriteZeroes(ctx, 0, size+512, 0) }},
		{"discard misaligned", func() error { return d.Discard(ctx, 1, 512) }},
	}
	for _, c := range cases {
		if err := c.call(); !errors.Is(err, block.ErrInvalid) {
			t.Errorf("%s: %v is not ErrInvalid", c.name, err)
		}
	}
	if n := len(lun.Ops()); n != 0 {
		t.Fatalf("%d commands sent for invalid requests", n)
	}
	// Zero-length requests at the end are valid and send nothing.
	if err := d.ReadAt(ctx, nil, size); err != nil || len(lun.Ops()) != 0 {
		t.Fatalf("empty read: %v", err)
	}
}

func TestErrorMapping(t *testing.T) {
	tests := []struct {
		name  string
		fault scsitest.Fault
		want  error
	}{
		{"medium error", scsitest.Fault{Opcode: scsi.OpRead16, Key: scsi.KeyMediumError, ASC: 0x11}, block.ErrMedium},
		{"write protected", scsitest.Fault{Opcode: scsi.OpRead16, Key: scsi.KeyDataProtect, ASC: 0x27}, block.ErrReadOnly},
		{"thin pool full", scsitest.Fault{Opcode: scsi.OpRead16, Key: scsi.KeyDataProtect, ASC: 0x27, ASCQ: 0x07, Descriptor: true}, block.ErrNoSpace},
		{"lba out of range", scsitest.Fault{Opcode: scsi.OpRead16, Key: scsi.KeyIllegalRequest, ASC: 0x21}, block.ErrInvalid},
		{"hardware", scsitest.Fault{Opcode: scsi.OpRead16, Key: scsi.KeyHardwareError, ASC: 0x44}, block.ErrIO},
		{"reservation conflict", scsitest.Fault{Opcode: scsi.OpRead16, Status: scsi.StatusReservationConflict}, block.ErrIO},
		{"transport", scsitest.Fault{Opcode: scsi.OpRead16, Err: errors.New("connection reset by peer")}, block.ErrIO},
		{"busy forever", scsitest.Fault{Opcode: scsi.OpRead16, Status: scsi.StatusBusy, Times: 100}, block.ErrIO},
		{"path timeout", scsitest.Fault{Opcode: scsi.OpRead16, Err: fmt.Errorf("session: %w", block.ErrTimeout)}, block.ErrTimeout},
	}
	all := []error{block.ErrIO, block.ErrInvalid, block.ErrReadOnly, block.ErrNoSpace, block.ErrNotSupported,
		block.ErrMedium, block.ErrTimeout, block.ErrClosed, block.ErrNoPath}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, lun := open(t, scsitest.Config{})
			lun.InjectFault(tt.fault)
			err := d.ReadAt(context.Background(), make([]byte, 4096), 0)
			matched := 0
			for _, s := range all {
				if errors.Is(err, s) {
					matched++
				}
			}
			if !errors.Is(err, tt.want) || matched != 1 {
				t.Fatalf("err %v: want only %v (matches %d sentinels)", err, tt.want, matched)
			}
		})
	}
	// Transient conditions are retried and succeed.
	for _, f := range []scsitest.Fault{
		{Opcode: scsi.OpWrite16, Status: scsi.StatusBusy, Times: 3},
		{Opcode: scsi.OpWrite16, Status: scsi.StatusTaskSetFull, Times: 2},
		{Opcode: scsi.OpWrite16, Key: scsi.KeyUnitAttention, ASC: 0x2A, ASCQ: 0x09},
		{Opcode: scsi.OpWrite16, Key: scsi.KeyAbortedCommand, ASC: 0x47},
	} {
		d, lun := open(t, scsitest.Config{})
		lun.InjectFault(f)
		if err := d.WriteAt(context.Background(), randBytes(512), 0, 0); err != nil {
			t.Fatalf("%+v not retried: %v", f, err)
		}
		if got := lun.Count(scsi.OpWrite16); got != int64(max(f.Times, 1))+1 {
			t.Fatalf("%+v: %d attempts", f, got)
		}
	}
}

// residualExec makes a lying target: GOOD with a residual.
type residualExec struct{ ex scsi.Executor }

func (r residualExec) Execute(ctx context.Context, cmd *scsi.Command, resp *scsi.Response) error {
	err := r.ex.Execute(ctx, cmd, resp)
	if cmd.CDB[0] == scsi.OpRead16 {
		resp.Residual = 512
	}
	return err
}

func TestShortReadIsAnError(t *testing.T) {
	d, err := NewDevice(context.Background(), []scsi.Executor{residualExec{scsitest.New(scsitest.Config{})}}, 0, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.ReadAt(context.Background(), make([]byte, 4096), 0); !errors.Is(err, block.ErrIO) {
		t.Fatalf("short read returned %v", err)
	}
}

func TestReadOnly(t *testing.T) {
	d, lun := open(t, scsitest.Config{ReadOnly: true, LBPU: true, Thin: true})
	ctx := context.Background()
	for name, err := range map[string]error{
		"write":   d.WriteAt(ctx, make([]byte, 512), 0, 0),
		"zeroes":  d.WriteZeroes(ctx, 0, 512, 0),
		"discard": d.Discard(ctx, 0, 512),
	} {
		if !errors.Is(err, block.ErrReadOnly) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if len(lun.Ops()) != 0 {
		t.Fatalf("commands sent to a read-only LUN: %+v", lun.Ops())
	}
	if err := d.ReadAt(ctx, make([]byte, 512), 0); err != nil {
		t.Fatal(err)
	}
	// Options.ReadOnly on a writable LUN.
	lun2 := scsitest.New(scsitest.Config{})
	d2, err := NewDevice(ctx, []scsi.Executor{lun2}, 0, Options{ReadOnly: true}, nil)
	if err != nil || !d2.Limits().ReadOnly {
		t.Fatalf("%v %+v", err, d2.Limits())
	}
	if err := d2.WriteAt(ctx, make([]byte, 512), 0, 0); !errors.Is(err, block.ErrReadOnly) {
		t.Fatal(err)
	}
}

func TestTenByteCommands(t *testing.T) {
	d, lun := open(t, scsitest.Config{NoReadCapacity16: true, No16ByteRW: true, Blocks: 1 << 18, WCE: true, MaxTransferBlocks: 1 << 20})
	if d.Limits().MaxTransfer != 0xFFFF*512 {
		t.Fatalf("max transfer %d, want the READ(10) limit", d.Limits().MaxTransfer)
	}
	data := randBytes(40 << 20) // more than 0xFFFF blocks: split
	if err := d.WriteAt(context.Background(), data, 512, block.FUA); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if err := d.ReadAt(context.Background(), got, 512); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %v", err)
	}
	if lun.Count(scsi.OpWrite10) != 2 || lun.Count(scsi.OpRead10) != 2 || lun.Count(scsi.OpSynchronizeCache10) != 1 {
		t.Fatalf("ops %+v", lun.Ops())
	}
}

func TestTransferCap(t *testing.T) {
	lun := scsitest.New(scsitest.Config{MaxTransferBlocks: 4096})
	d, err := NewDevice(context.Background(), []scsi.Executor{cappedExec{lun}}, 0, Options{MaxTransfer: 1 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.Limits().MaxTransfer != 512<<10 {
		t.Fatalf("max transfer %d, want the transport's 512 KiB", d.Limits().MaxTransfer)
	}
}

type cappedExec struct{ *scsitest.LUN }

func (cappedExec) MaxCommandData() int64 { return 512 << 10 }

func TestClose(t *testing.T) {
	closed := 0
	lun := scsitest.New(scsitest.Config{})
	d, err := NewDevice(context.Background(), []scsi.Executor{lun}, 0, Options{}, func() error { closed++; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil || closed != 1 {
		t.Fatalf("close: %v, closer ran %d times", err, closed)
	}
	if err := d.Close(); err != nil || closed != 1 {
		t.Fatalf("second close: %v, closer ran %d times", err, closed)
	}
	ctx := context.Background()
	for _, err := range []error{d.ReadAt(ctx, make([]byte, 512), 0), d.WriteAt(ctx, make([]byte, 512), 0, 0), d.Flush(ctx),
		d.Discard(ctx, 0, 512), d.WriteZeroes(ctx, 0, 512, 0)} {
		if !errors.Is(err, block.ErrClosed) {
			t.Fatalf("after close: %v", err)
		}
	}
}

func TestConcurrentRandomIO(t *testing.T) {
	d, lun := open(t, scsitest.Config{Blocks: 1 << 16, MaxTransferBlocks: 128})
	_ = lun
	ctx := context.Background()
	const workers, per = 8, 16
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each worker owns a disjoint 2 MiB region.
			base := int64(w) * (2 << 20)
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range per {
				n := (1 + r.IntN(256)) * 4096 % (2 << 20)
				off := base + int64(r.IntN((2<<20-n)/512+1))*512
				data := randBytes(n)
				if err := d.WriteAt(ctx, data, off, 0); err != nil {
					errs <- err
					return
				}
				got := make([]byte, n)
				if err := d.ReadAt(ctx, got, off); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got, data) {
					errs <- fmt.Errorf("worker %d: mismatch at %d+%d", w, off, n)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestHotPathAllocatesNothing(t *testing.T) {
	lun := scsitest.New(scsitest.Config{})
	d, err := NewDevice(context.Background(), []scsi.Executor{lun}, 0, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	buf := make([]byte, 4096)
	_ = d.WriteAt(ctx, buf, 0, 0) // allocate the fake's chunk
	allocs := testing.AllocsPerRun(200, func() {
		if err := d.WriteAt(ctx, buf, 0, 0); err != nil {
			t.Fatal(err)
		}
		if err := d.ReadAt(ctx, buf, 0); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("ReadAt+WriteAt allocate %v times per call pair", allocs)
	}
}

func BenchmarkReadAt4K(b *testing.B)  { benchIO(b, 4096, false) }
func BenchmarkWriteAt4K(b *testing.B) { benchIO(b, 4096, true) }
func BenchmarkReadAt1M(b *testing.B)  { benchIO(b, 1<<20, false) }

func benchIO(b *testing.B, n int, write bool) {
	lun := scsitest.New(scsitest.Config{})
	d, err := NewDevice(context.Background(), []scsi.Executor{lun}, 0, Options{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	buf := make([]byte, n)
	_ = d.WriteAt(ctx, buf, 0, 0)
	b.SetBytes(int64(n))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		p := make([]byte, n)
		for pb.Next() {
			var err error
			if write {
				err = d.WriteAt(ctx, p, 0, 0)
			} else {
				err = d.ReadAt(ctx, p, 0)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestPreferredDesignator(t *testing.T) {
	naa := func(first byte) scsi.Designator {
		return scsi.Designator{Type: scsi.DesigNAA, Value: []byte{first, 0, 0, 0, 0, 0, 0, 1}}
	}
	t10 := scsi.Designator{Type: scsi.DesigT10, CodeSet: scsi.CodeSetASCII, Value: []byte("IET     0001")}
	port := naa(0x60)
	port.Association = scsi.AssocPort
	tests := []struct {
		in   []scsi.Designator
		want string
	}{
		{[]scsi.Designator{t10, naa(0x30), naa(0x60)}, "naa.6000000000000001"},
		{[]scsi.Designator{naa(0x30), t10}, "naa.3000000000000001"},
		{[]scsi.Designator{t10, port}, "t10.IET     0001"},
		{nil, ""},
	}
	for _, tt := range tests {
		if got := preferredDesignator(tt.in); got != tt.want {
			t.Errorf("preferredDesignator = %q, want %q", got, tt.want)
		}
	}
}

// flakyPath is a session that can go down: then every command fails with a connection error
// and Connected reports false.
type flakyPath struct {
	ex   scsi.Executor
	down atomic.Bool
	// dieOnNext makes the next command kill the path (the command fails, as on a connection
	// loss mid-command).
	dieOnNext atomic.Bool
	n         atomic.Int64
}

var errConnLost = fmt.Errorf("connection reset by peer: %w", block.ErrIO)

func (f *flakyPath) Execute(ctx context.Context, cmd *scsi.Command, resp *scsi.Response) error {
	f.n.Add(1)
	if f.dieOnNext.CompareAndSwap(true, false) {
		f.down.Store(true)
	}
	if f.down.Load() {
		return errConnLost
	}
	return f.ex.Execute(ctx, cmd, resp)
}

func (f *flakyPath) Connected() bool { return !f.down.Load() }

func TestPathFailover(t *testing.T) {
	lun := scsitest.New(scsitest.Config{MaxTransferBlocks: 8})
	a, b := &flakyPath{ex: lun}, &flakyPath{ex: lun}
	d, err := NewDevice(context.Background(), []scsi.Executor{a, b}, 0, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	data := randBytes(64 << 10)

	// A path that is down is never chosen.
	a.down.Store(true)
	a.n.Store(0)
	if err := d.WriteAt(ctx, data, 0, 0); err != nil {
		t.Fatal(err)
	}
	if a.n.Load() != 0 {
		t.Fatalf("%d commands sent to a path that is down", a.n.Load())
	}

	// A path that dies under a command: the command is re-issued on the other one.
	a.down.Store(false)
	b.dieOnNext.Store(true)
	got := make([]byte, len(data))
	for i := range 4 { // enough commands that b is picked at least once
		if err := d.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read %d after a path died: %v", i, err)
		}
	}
	if !b.down.Load() {
		t.Fatal("path b was never used")
	}

	// Every path down: the connection error surfaces as ErrIO.
	a.down.Store(true)
	if err := d.ReadAt(ctx, got, 0); !errors.Is(err, block.ErrIO) {
		t.Fatalf("all paths down: %v", err)
	}
	// SCSI errors are not path failures: no re-issue.
	a.down.Store(false)
	b.down.Store(false)
	lun.InjectFault(scsitest.Fault{Opcode: scsi.OpRead16, Key: scsi.KeyMediumError, ASC: 0x11})
	lun.ResetOps()
	if err := d.ReadAt(ctx, got[:4096], 0); !errors.Is(err, block.ErrMedium) || lun.Count(scsi.OpRead16) != 1 {
		t.Fatalf("medium error: %v after %d reads", err, lun.Count(scsi.OpRead16))
	}
}

// zeroUnmapLimits rewrites the Block Limits VPD to report MAXIMUM UNMAP LBA COUNT 0.
type zeroUnmapLimits struct{ *scsitest.LUN }

func (z zeroUnmapLimits) Execute(ctx context.Context, cmd *scsi.Command, resp *scsi.Response) error {
	err := z.LUN.Execute(ctx, cmd, resp)
	if cmd.CDB[0] == scsi.OpInquiry && cmd.CDB[1]&1 != 0 && cmd.CDB[2] == scsi.VPDBlockLimits && len(cmd.Data) >= 28 {
		clear(cmd.Data[20:24])
	}
	return err
}

// LIO refuses WRITE SAME on some backstores (and above its length limit) with ILLEGAL REQUEST,
// INVALID FIELD IN CDB rather than INVALID OPERATION CODE: the range must still end up zeroed,
// by writing zeroes, and the client must not see EINVAL.
func TestWriteZeroesFallsBackOnInvalidField(t *testing.T) {
	d, lun := open(t, scsitest.Config{MaxTransferBlocks: 1024})
	const off, n = 512 * 8, 4096 * 64
	if err := d.WriteAt(context.Background(), bytes.Repeat([]byte{0xCD}, n), off, 0); err != nil {
		t.Fatal(err)
	}
	lun.InjectFault(scsitest.Fault{Opcode: int(scsi.OpWriteSame16), Times: 1000,
		Key: scsi.KeyIllegalRequest, ASC: 0x24, ASCQ: 0x00})
	lun.ResetOps()
	if err := d.WriteZeroes(context.Background(), off, n, 0); err != nil {
		t.Fatalf("WriteZeroes over a target refusing WRITE SAME: %v", err)
	}
	if got := lun.Bytes(off, n); !bytes.Equal(got, make([]byte, n)) {
		t.Fatal("range does not read back as zeroes")
	}
	if len(opsWith(lun, scsi.OpWrite16)) == 0 {
		t.Fatalf("no WRITE(16) of zeroes was sent: %+v", lun.Ops())
	}
	// The target never accepted WRITE SAME: the next request goes straight to writing zeroes.
	lun.ResetOps()
	if err := d.WriteZeroes(context.Background(), off, 4096, 0); err != nil {
		t.Fatal(err)
	}
	if ws := opsWith(lun, scsi.OpWriteSame16); len(ws) != 0 {
		t.Fatalf("WRITE SAME retried after the target refused it: %+v", ws)
	}
}

// A Block Limits page claiming a backstore-sized MAXIMUM TRANSFER LENGTH (LIO's RAM disk says
// 2 TiB) is capped, so neither Limits nor `iser-blk info` promise terabyte commands.
func TestMaxTransferCappedWhenTargetClaimsHuge(t *testing.T) {
	d, _ := open(t, scsitest.Config{MaxTransferBlocks: 0xFFFFFFFF})
	if got := d.Limits().MaxTransfer; got != maxSaneTransfer {
		t.Fatalf("MaxTransfer = %d, want the %d cap", got, maxSaneTransfer)
	}
	d2, _ := open(t, scsitest.Config{MaxTransferBlocks: 2048})
	if got := d2.Limits().MaxTransfer; got != 2048*512 {
		t.Fatalf("MaxTransfer = %d, want the target's own 1 MiB", got)
	}
}
