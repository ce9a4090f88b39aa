package nbd

import (
	"bytes"
	"context"
	"testing"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/backend/iser/scsi/scsitest"
)

// TestNBDCommandsBecomeSCSI runs the NBD server over the real SCSI device layer (backend/iser's
// Device) on a fake LUN and checks what reaches the target: an NBD FLUSH is a SYNCHRONIZE CACHE,
// a WRITE with FUA is a SCSI WRITE with FUA, a TRIM is an UNMAP, and the data round-trips.
func TestNBDCommandsBecomeSCSI(t *testing.T) {
	lun := scsitest.New(scsitest.Config{Blocks: (64 << 20) / 512, WCE: true, DPOFUA: true,
		Thin: true, LBPU: true, LBPWS: true, LBPRZ: true, Log: true})
	dev, err := iser.NewDevice(context.Background(), []scsi.Executor{lun}, 0, iser.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	f := startServer(t, dev, Options{})
	c := f.dial().connect(true)
	want := uint16(flagSendFlush | flagSendFUA | flagSendTrim | flagSendWriteZeroes | FlagCanMultiConn)
	if c.flags&want != want {
		t.Fatalf("flags %#x lack %#x", c.flags, want)
	}
	syncs := func() int64 { return lun.Count(scsi.OpSynchronizeCache10) + lun.Count(scsi.OpSynchronizeCache16) }

	data := bytes.Repeat([]byte("iser-blk"), 512)
	if r := c.do(cmdWrite, 0, 1<<20, 4096, data); r.errno != 0 {
		t.Fatal(r.errno)
	}
	before := syncs()
	if r := c.do(cmdFlush, 0, 0, 0, nil); r.errno != 0 {
		t.Fatalf("flush: errno %d", r.errno)
	}
	if got := syncs() - before; got != 1 {
		t.Fatalf("NBD FLUSH produced %d SYNCHRONIZE CACHE commands, want 1", got)
	}

	lun.ResetOps()
	if r := c.do(cmdWrite, cmdFlagFUA, 2<<20, 4096, data); r.errno != 0 {
		t.Fatal(r.errno)
	}
	var fua bool
	for _, op := range lun.Ops() {
		if (op.Opcode == scsi.OpWrite16 || op.Opcode == scsi.OpWrite10) && op.FUA && op.LBA == (2<<20)/512 {
			fua = true
		}
	}
	if !fua {
		t.Errorf("NBD WRITE+FUA did not become a SCSI WRITE with FUA: %+v", lun.Ops())
	}

	unmaps := lun.Count(scsi.OpUnmap) + lun.Count(scsi.OpWriteSame16)
	if r := c.do(cmdTrim, 0, 1<<20, 4096, nil); r.errno != 0 {
		t.Fatalf("trim: errno %d", r.errno)
	}
	if lun.Count(scsi.OpUnmap)+lun.Count(scsi.OpWriteSame16) == unmaps {
		t.Error("NBD TRIM reached the LUN as neither UNMAP nor WRITE SAME with UNMAP")
	}
	if r := c.do(cmdRead, 0, 2<<20, 4096, nil); !bytes.Equal(r.data, data) {
		t.Error("read back through SCSI differs")
	}
	if !bytes.Equal(lun.Bytes(2<<20, 4096), data) {
		t.Error("LUN content differs")
	}
}
