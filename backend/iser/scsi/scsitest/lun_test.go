package scsitest

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
)

// run executes one command and returns CheckCommand's verdict.
func run(t *testing.T, l *LUN, build func(c *scsi.Command)) (*scsi.Response, error) {
	t.Helper()
	var c scsi.Command
	var r scsi.Response
	build(&c)
	if err := l.Execute(context.Background(), &c, &r); err != nil {
		return &r, err
	}
	return &r, scsi.CheckCommand(&c, &r)
}

func TestFakeIsStrict(t *testing.T) {
	l := New(Config{Blocks: 100, MaxTransferBlocks: 8, LBPU: true, MaxUnmapLBACount: 10, MaxUnmapDescriptors: 2, MaxWriteSameBlocks: 16})
	blk := make([]byte, 512)
	unmap := func(descs ...scsi.UnmapDescriptor) func(c *scsi.Command) {
		return func(c *scsi.Command) {
			c.Unmap(scsi.EncodeUnmap(make([]byte, scsi.UnmapParamLen(len(descs))), descs))
		}
	}
	tests := []struct {
		name  string
		build func(c *scsi.Command)
		want  error
	}{
		{"read ok", func(c *scsi.Command) { c.Read16(99, 1, false, blk) }, nil},
		{"read past end", func(c *scsi.Command) { c.Read16(99, 2, false, make([]byte, 1024)) }, block.ErrInvalid},
		{"read over max transfer", func(c *scsi.Command) { c.Read16(0, 9, false, make([]byte, 9*512)) }, block.ErrInvalid},
		{"buffer disagrees with CDB", func(c *scsi.Command) { c.Write16(0, 2, false, blk) }, block.ErrInvalid},
		{"unmap ok", unmap(scsi.UnmapDescriptor{LBA: 0, Blocks: 5}, scsi.UnmapDescriptor{LBA: 50, Blocks: 5}), nil},
		{"unmap too many blocks", unmap(scsi.UnmapDescriptor{LBA: 0, Blocks: 11}), block.ErrInvalid},
		{"unmap too many descriptors", unmap(scsi.UnmapDescriptor{}, scsi.UnmapDescriptor{}, scsi.UnmapDescriptor{}), block.ErrInvalid},
		{"write same too long", func(c *scsi.Command) { c.WriteSame16(0, 17, false, false, blk) }, block.ErrInvalid},
		{"write same zero blocks (WSNZ)", func(c *scsi.Command) { c.WriteSame16(0, 0, false, false, blk) }, block.ErrInvalid},
		{"write same unmap without LBPWS", func(c *scsi.Command) { c.WriteSame16(0, 1, true, false, blk) }, block.ErrInvalid},
		{"unknown opcode", func(c *scsi.Command) { c.TestUnitReady(); c.CDB[0] = 0xC7 }, block.ErrNotSupported},
		{"mode sense other page", func(c *scsi.Command) { c.ModeSense10(0x0A, 0, 0, true, make([]byte, 64)) }, block.ErrInvalid},
	}
	for _, tt := range tests {
		_, err := run(t, l, tt.build)
		if (tt.want == nil) != (err == nil) || (tt.want != nil && !errors.Is(err, tt.want)) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
}

func TestFakeStorageAndFaults(t *testing.T) {
	l := New(Config{Log: true})
	data := bytes.Repeat([]byte("0123456789abcdef"), 8192) // 128 KiB across two chunks
	if _, err := run(t, l, func(c *scsi.Command) { c.Write16(100, uint32(len(data)/512), false, data) }); err != nil {
		t.Fatal(err)
	}
	if got := l.Bytes(100*512, int64(len(data))); !bytes.Equal(got, data) {
		t.Fatal("stored bytes differ")
	}
	l.SetUnitAttention(0x29, 0)
	l.InjectFault(Fault{Opcode: scsi.OpRead16, Status: scsi.StatusBusy, Times: 2})
	l.InjectFault(Fault{Opcode: -1, Err: errors.New("link down")})
	// INQUIRY is not held up by the UNIT ATTENTION, but a fault for every opcode hits it.
	if _, err := run(t, l, func(c *scsi.Command) { c.Inquiry(make([]byte, 36)) }); err == nil || err.Error() != "link down" {
		t.Fatalf("fault for any opcode: %v", err)
	}
	if r, _ := run(t, l, func(c *scsi.Command) { c.Read16(0, 1, false, make([]byte, 512)) }); r.Status != scsi.StatusBusy {
		t.Fatalf("first read: %v", r.Status)
	}
	if r, _ := run(t, l, func(c *scsi.Command) { c.Read16(0, 1, false, make([]byte, 512)) }); r.Status != scsi.StatusBusy {
		t.Fatalf("second read: %v", r.Status)
	}
	if r, _ := run(t, l, func(c *scsi.Command) { c.Read16(0, 1, false, make([]byte, 512)) }); scsi.Classify(r) != scsi.RetryNow {
		t.Fatalf("third read should see the UNIT ATTENTION: %+v", r.Status)
	}
	if _, err := run(t, l, func(c *scsi.Command) { c.Read16(0, 1, false, make([]byte, 512)) }); err != nil {
		t.Fatalf("fourth read: %v", err)
	}
	// The transport failure never reached the "target": it is not logged.
	if n := l.Count(scsi.OpRead16); n != 4 || len(l.Ops()) != 5 {
		t.Fatalf("count %d, %d ops", n, len(l.Ops()))
	}
}

func TestFakeZeroingSemantics(t *testing.T) {
	for _, lbprz := range []bool{false, true} {
		l := New(Config{LBPU: true, LBPWS: true, LBPRZ: lbprz})
		ones := bytes.Repeat([]byte{1}, 4096)
		if _, err := run(t, l, func(c *scsi.Command) { c.Write16(0, 8, false, ones) }); err != nil {
			t.Fatal(err)
		}
		if _, err := run(t, l, func(c *scsi.Command) {
			c.Unmap(scsi.EncodeUnmap(make([]byte, 24), []scsi.UnmapDescriptor{{LBA: 0, Blocks: 4}}))
		}); err != nil {
			t.Fatal(err)
		}
		want := byte(0xDB)
		if lbprz {
			want = 0
		}
		if got := l.Bytes(0, 2048); !bytes.Equal(got, bytes.Repeat([]byte{want}, 2048)) {
			t.Fatalf("LBPRZ=%v: unmapped blocks read %x", lbprz, got[0])
		}
		if _, err := run(t, l, func(c *scsi.Command) { c.WriteSame16(4, 4, false, true, nil) }); err != nil {
			t.Fatal(err)
		}
		if got := l.Bytes(2048, 2048); !bytes.Equal(got, make([]byte, 2048)) {
			t.Fatal("WRITE SAME NDOB did not write zeroes")
		}
	}
}
