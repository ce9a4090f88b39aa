package iser

// ALUA (SPC-5 §5.16): when INQUIRY reports TPGS, each path's port group is read from VPD page
// 0x83 through that path, and the groups' access states from REPORT TARGET PORT GROUPS. pick()
// then prefers active/optimized paths, then active/non-optimized, then transitioning, and uses
// standby/unavailable/offline ones only when nothing else is up. The states are re-read after
// a path is restored and on UNIT ATTENTION "asymmetric access state changed" (2Ah/06h) or a
// reset (29h). A target without ALUA (tgt) leaves every path at rank 0.

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

// aluaRank orders access states for path selection (lower is better).
func aluaRank(s scsi.ALUAState) int32 {
	switch s {
	case scsi.ALUAOptimized:
		return 0
	case scsi.ALUANonOptimized:
		return 1
	case scsi.ALUATransitioning:
		return 2
	}
	return 3
}

// kickALUA starts a refresh in the background unless one is running or the device is closed.
func (d *Device) kickALUA() {
	if !d.alua || d.closed.Load() || !d.aluaBusy.CompareAndSwap(false, true) {
		return
	}
	d.aluaWG.Add(1)
	go func() {
		defer d.aluaWG.Done()
		defer d.aluaBusy.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := d.refreshALUAOnce(ctx); err != nil {
			d.log.Warn("ALUA: refreshing the target port groups failed", zap.Error(err))
		}
	}()
}

// refreshALUA reads the port groups now (Open), unless a background refresh is running.
func (d *Device) refreshALUA(ctx context.Context) error {
	if !d.aluaBusy.CompareAndSwap(false, true) {
		return nil
	}
	defer d.aluaBusy.Store(false)
	return d.refreshALUAOnce(ctx)
}

func (d *Device) refreshALUAOnce(ctx context.Context) error {
	var via *path
	for _, p := range d.paths {
		if !p.up() {
			continue
		}
		if via == nil {
			via = p
		}
		if p.tpg.Load() >= 0 {
			continue
		}
		// The group of the port this path's session goes through.
		buf := make([]byte, 1024)
		r := &request{}
		r.cmd.LUN = d.lun
		r.cmd.InquiryVPD(scsi.VPDDeviceIdentification, buf)
		if err := d.retry.Execute(ctx, p.ex, &r.cmd, &r.resp); err != nil {
			return fmt.Errorf("VPD 0x83 on %s: %w", p.name, err)
		}
		ds, err := scsi.ParseDeviceIdentification(received(buf, r))
		if err != nil {
			return fmt.Errorf("VPD 0x83 on %s: %w", p.name, err)
		}
		if g, ok := scsi.PortGroup(ds); ok {
			p.tpg.Store(int32(g))
		}
	}
	if via == nil {
		return nil // nothing up; a restore kicks another refresh
	}
	buf := make([]byte, 4096)
	r := &request{}
	r.cmd.LUN = d.lun
	r.cmd.ReportTargetPortGroups(buf)
	if err := d.retry.Execute(ctx, via.ex, &r.cmd, &r.resp); err != nil {
		return fmt.Errorf("REPORT TARGET PORT GROUPS: %w", err)
	}
	groups, err := scsi.ParseReportTargetPortGroups(received(buf, r))
	if err != nil {
		return err
	}
	states := map[uint16]scsi.ALUAState{}
	for _, g := range groups {
		states[g.ID] = g.State
	}
	for _, p := range d.paths {
		g := p.tpg.Load()
		if g < 0 {
			continue
		}
		st, ok := states[uint16(g)]
		if !ok {
			continue
		}
		// The rank pick() reads goes first: whoever sees the new state (PathStats, the log)
		// may rely on selection already following it.
		p.aluaClass.Store(aluaRank(st))
		if old := p.aluaState.Swap(int32(st)); old != int32(st) {
			d.log.Info("ALUA: path state", zap.String("portal", p.name), zap.Int32("port_group", g),
				zap.Stringer("state", st))
		}
	}
	return nil
}
