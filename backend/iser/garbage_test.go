package iser

import (
	"bytes"
	"context"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/iscsitest"
	"github.com/iser-blk/iser-blk/backend/iser/scsi/scsitest"
)

// TestGarbageFromTheTarget: a target that answers a READ with a bad PDU (wrong ITT, data beyond
// the buffer, bad header or data digest, a wrong opcode, an out-of-order DataSN) makes the
// session drop the connection; the device logs in again and re-issues the read, which then
// returns the right data. No panic, and no byte of the bad PDU is left in the caller's buffer.
func TestGarbageFromTheTarget(t *testing.T) {
	for _, f := range []iscsitest.Fault{iscsitest.FaultWrongITT, iscsitest.FaultDataBeyondBuffer,
		iscsitest.FaultBadHeaderDigest, iscsitest.FaultBadDataDigest, iscsitest.FaultWrongOpcode,
		iscsitest.FaultWrongDataSN} {
		t.Run(f.String(), func(t *testing.T) {
			digests := f == iscsitest.FaultBadHeaderDigest || f == iscsitest.FaultBadDataDigest
			lun := scsitest.New(scsitest.Config{Blocks: 8192, MaxTransferBlocks: 64})
			tg, err := iscsitest.Start(lun, iscsitest.Options{Digests: digests})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tg.Close() })
			opts := Options{InitiatorName: "iqn.2026-11.io.iser-blk:unit", Logger: zaptest.NewLogger(t),
				Recovery: &Recovery{ReplacementTimeout: 10 * time.Second, ReconnectMin: time.Millisecond, ReconnectMax: 10 * time.Millisecond}}
			if digests {
				p := login.DefaultProposal()
				p.HeaderDigest, p.DataDigest = login.DigestCRC32C, login.DigestCRC32C
				opts.proposal = &p
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			d, err := Open(ctx, tg.URL(0), opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Close() })
			want := randBytes(32 << 10)
			if err := d.WriteAt(ctx, want, 64<<10, 0); err != nil {
				t.Fatal(err)
			}
			if got := lun.Bytes(64<<10, int64(len(want))); !bytes.Equal(got, want) {
				t.Fatal("write did not reach the LUN")
			}
			logins := tg.Logins()
			tg.Inject(f)
			got := make([]byte, len(want))
			if err := d.ReadAt(ctx, got, 64<<10); err != nil {
				t.Fatalf("read answered with %v: %v", f, err)
			}
			if tg.BadPDUs() != 1 {
				t.Fatalf("%d bad PDUs sent", tg.BadPDUs())
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("read after %v returned wrong data (poison bytes: %d)", f, bytes.Count(got, []byte{iscsitest.PoisonByte}))
			}
			if tg.Logins() != logins+1 {
				t.Fatalf("logins %d -> %d: the connection was not re-established once", logins, tg.Logins())
			}
			// The maintainer counts the restore just after the session is back; the read may be faster.
			waitFor(t, "restore counted", 5*time.Second, func() bool { return d.PathStats()[0].Restores == 1 })
			st := d.PathStats()[0]
			if st.Downs != 1 || st.Restores != 1 || st.Replayed != 1 {
				t.Fatalf("path stats %+v", st)
			}
		})
	}
}

// TestStuckReadAbortedAndReissued: a READ the target never answers is ended by the command
// watchdog's ABORT TASK over a real session, re-issued on the same connection, and returns the
// right data; no reconnect was needed.
func TestStuckReadAbortedAndReissued(t *testing.T) {
	lun := scsitest.New(scsitest.Config{Blocks: 8192})
	tg, err := iscsitest.Start(lun, iscsitest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	rec := Recovery{CommandTimeout: 200 * time.Millisecond, NOPTimeout: time.Second, ReplacementTimeout: 10 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := Open(ctx, tg.URL(0), Options{InitiatorName: "iqn.2026-11.io.iser-blk:unit", Logger: zaptest.NewLogger(t), Recovery: &rec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	want := randBytes(8192)
	if err := d.WriteAt(ctx, want, 0, 0); err != nil {
		t.Fatal(err)
	}
	tg.Inject(iscsitest.FaultHang)
	got := make([]byte, len(want))
	start := time.Now()
	if err := d.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("stuck read: %v (data equal: %v)", err, bytes.Equal(got, want))
	}
	t.Logf("stuck read completed after %v", time.Since(start).Round(time.Millisecond))
	if tg.Logins() != 1 {
		t.Fatalf("%d logins: the connection was dropped instead of aborting the task", tg.Logins())
	}
	deadline := time.Now().Add(5 * time.Second)
	for d.PathStats()[0].Aborts != 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // the watchdog counts after the TMF returns
	}
	if st := d.PathStats()[0]; st.Aborts != 1 || st.Downs != 0 || st.Replayed != 1 {
		t.Fatalf("path stats %+v", st)
	}
}

// TestPortalsFromDiscovery: the first portal's SendTargets lists a second portal of the same
// target (tgt reports only the address asked, so this uses the fake); Open adds a path to it.
func TestPortalsFromDiscovery(t *testing.T) {
	lun := scsitest.New(scsitest.Config{Blocks: 8192})
	second, err := iscsitest.Start(lun, iscsitest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Close() })
	first, err := iscsitest.Start(lun, iscsitest.Options{Advertise: []string{"0.0.0.0:3260", "[::]:3260", second.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { first.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := Open(ctx, first.URL(0), Options{InitiatorName: "iqn.2026-11.io.iser-blk:unit", Logger: zaptest.NewLogger(t),
		PortalsFromDiscovery: true, AlternateTargets: []string{second.URL(0)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	st := d.PathStats()
	if len(st) != 2 || st[0].Portal != first.Addr || st[1].Portal != second.Addr {
		t.Fatalf("paths %+v; want %s and %s (unspecified addresses skipped, duplicates merged)", st, first.Addr, second.Addr)
	}
	buf := make([]byte, 4096)
	for range 8 {
		if err := d.ReadAt(ctx, buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	if st := d.PathStats(); st[0].Commands == 0 || st[1].Commands == 0 {
		t.Fatalf("reads not spread over both paths: %+v", st)
	}
}
