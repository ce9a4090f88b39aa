package iser

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/backend/iser/scsi/scsitest"
)

// aluaGroups is the shared ALUA state of a fake multi-port target: port group id -> state.
type aluaGroups struct {
	mu     sync.Mutex
	states map[uint16]scsi.ALUAState
}

func (g *aluaGroups) set(id uint16, s scsi.ALUAState) {
	g.mu.Lock()
	g.states[id] = s
	g.mu.Unlock()
}

// aluaPort is one path of an ALUA target: the LUN through a port of group tpg. It adds what
// scsitest lacks: INQUIRY TPGS=01b, the port group designator in VPD 0x83, and REPORT TARGET
// PORT GROUPS; and it counts READs and WRITEs.
type aluaPort struct {
	*fakeSession
	tpg    uint16
	groups *aluaGroups
	rw     atomic.Int64
}

func (a *aluaPort) Execute(ctx context.Context, cmd *scsi.Command, resp *scsi.Response) error {
	c := cmd.CDB
	if c[0] == scsi.OpMaintenanceIn && c[1]&0x1F == scsi.SAReportTargetPortGroups {
		if !a.Connected() {
			return a.fakeSession.Execute(ctx, cmd, resp)
		}
		a.groups.mu.Lock()
		var b []byte
		b = append(b, 0, 0, 0, 0)
		for id := uint16(1); id <= 2; id++ {
			b = append(b, byte(a.groups.states[id]), 0x0F, byte(id>>8), byte(id), 0, 0, 0, 1, 0, 0, byte(id>>8), byte(id))
		}
		a.groups.mu.Unlock()
		binary.BigEndian.PutUint32(b, uint32(len(b)-4))
		n := copy(cmd.Data, b)
		*resp = scsi.Response{Residual: int64(len(cmd.Data) - n)}
		return nil
	}
	switch c[0] {
	case scsi.OpRead16, scsi.OpWrite16, scsi.OpRead10, scsi.OpWrite10:
		a.rw.Add(1)
	}
	err := a.fakeSession.Execute(ctx, cmd, resp)
	if err != nil || c[0] != scsi.OpInquiry {
		return err
	}
	switch {
	case c[1]&1 == 0 && len(cmd.Data) > 5:
		cmd.Data[5] |= 0x10 // TPGS 01b: implicit ALUA
	case c[1]&1 == 1 && c[2] == scsi.VPDDeviceIdentification:
		n := int(binary.BigEndian.Uint16(cmd.Data[2:4]))
		desc := []byte{0x01, 0x15, 0, 4, 0, 0, byte(a.tpg >> 8), byte(a.tpg)} // binary, port, TPG
		if 4+n+len(desc) <= len(cmd.Data) {
			copy(cmd.Data[4+n:], desc)
			binary.BigEndian.PutUint16(cmd.Data[2:4], uint16(n+len(desc)))
			resp.Residual -= int64(len(desc))
		}
	}
	return nil
}

// TestALUAPrefersOptimizedPaths: I/O goes only to the active/optimized path; when the states
// swap (announced by UNIT ATTENTION 2Ah/06h) it moves to the other; when the optimized path
// dies, the non-optimized one serves (no request fails).
func TestALUAPrefersOptimizedPaths(t *testing.T) {
	lun := scsitest.New(scsitest.Config{})
	groups := &aluaGroups{states: map[uint16]scsi.ALUAState{1: scsi.ALUANonOptimized, 2: scsi.ALUAOptimized}}
	a := &aluaPort{fakeSession: newFakeSession(lun), tpg: 1, groups: groups}
	b := &aluaPort{fakeSession: newFakeSession(lun), tpg: 2, groups: groups}
	rec := fastRecovery()
	d, err := NewDevice(context.Background(), []scsi.Executor{a, b}, 0, Options{Recovery: &rec, Logger: zaptest.NewLogger(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if st := d.PathStats(); st[0].ALUA != "active/non-optimized" || st[1].ALUA != "active/optimized" {
		t.Fatalf("ALUA states after open: %+v", st)
	}
	ctx := context.Background()
	buf := randBytes(4096)
	io := func(n int) {
		t.Helper()
		for range n {
			if err := d.WriteAt(ctx, buf, 0, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	io(20)
	if a.rw.Load() != 0 || b.rw.Load() != 20 {
		t.Fatalf("optimized path b got %d commands, non-optimized a got %d", b.rw.Load(), a.rw.Load())
	}

	// The target swaps the states and says so with a UNIT ATTENTION.
	groups.set(1, scsi.ALUAOptimized)
	groups.set(2, scsi.ALUAStandby)
	lun.SetUnitAttention(0x2A, 0x06)
	io(1)
	waitFor(t, "ALUA refresh", 5*time.Second, func() bool {
		st := d.PathStats()
		return st[0].ALUA == "active/optimized" && st[1].ALUA == "standby"
	})
	a.rw.Store(0)
	b.rw.Store(0)
	io(20)
	if a.rw.Load() != 20 || b.rw.Load() != 0 {
		t.Fatalf("after the swap: a %d, b %d commands", a.rw.Load(), b.rw.Load())
	}

	// The optimized path dies: the standby one is the only one left and is used.
	a.refuse.Store(true)
	a.kill()
	b.rw.Store(0)
	io(5)
	if b.rw.Load() != 5 {
		t.Fatalf("with the optimized path down, b got %d commands", b.rw.Load())
	}
}
