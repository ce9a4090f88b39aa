package iser

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
)

// Info is the identity and capabilities of the LUN as probed at Open.
type Info struct {
	URL         string // the target URL (without secrets), "" for NewDevice
	LUN         uint16
	Vendor      string
	Product     string
	Revision    string
	Serial      string // unit serial number (VPD 0x80)
	Designators []scsi.Designator
	WWN         string // the preferred LU designator (NAA, else EUI-64, else SCSI name, else T10)

	Blocks            uint64
	Capacity          int64 // bytes
	LogicalBlockSize  uint32
	PhysicalBlockSize uint32
	MaxTransfer       int64 // bytes per command after all caps
	OptimalTransfer   int64 // bytes (0: not reported)

	ThinProvisioned  bool   // READ CAPACITY(16) LBPME
	UnmapSupported   bool   // LBPU
	WriteSameUnmap   bool   // LBPWS
	ZeroesAfterUnmap bool   // LBPRZ
	WriteSame        string // "yes", "no", "unknown" (tried on first use)
	WriteCache       bool   // WCE (assumed on when MODE SENSE failed)
	WriteCacheKnown  bool
	FUA              bool // DPOFUA
	ReadOnly         bool // WP: the LUN is write-protected (Limits().ReadOnly also reflects Options.ReadOnly)
	Rotational       bool // VPD 0xB1 reports a rotating medium
	Sessions         int
}

// probe runs the one-time identification of the LUN and fills d's geometry and limits: the SCSI
// conversation (prober) gathers what the target reports, deriveLimits (limits.go) turns it into
// limits without further I/O.
func (d *Device) probe(ctx context.Context, opts Options) error {
	d.info.LUN, _ = scsi.DecodeLUN(d.lun)
	d.info.Sessions = len(d.paths)
	pr := &prober{d: d, ctx: ctx, ex: d.probeExecutor(), r: &request{}}
	pr.r.cmd.LUN = d.lun
	rep, err := pr.converse(opts)
	if err != nil {
		return err
	}
	lim, err := deriveLimits(rep, d.transferCap(opts), opts.ReadOnly)
	if err != nil {
		return err
	}
	d.apply(rep, lim)
	return nil
}

// probeExecutor is the first path that is up (with several portals, the first may be down at
// start), else the first.
func (d *Device) probeExecutor() scsi.Executor {
	for _, p := range d.paths {
		if p.up() {
			return p.ex
		}
	}
	return d.paths[0].ex
}

// transferCap is the smallest cap on one command's data in bytes that Options and the paths'
// transports set (0: none).
func (d *Device) transferCap(opts Options) int64 {
	capBytes := opts.MaxTransfer
	for _, p := range d.paths {
		if tl, ok := p.ex.(transferLimiter); ok {
			if m := tl.MaxCommandData(); m > 0 && (capBytes == 0 || m < capBytes) {
				capBytes = m
			}
		}
	}
	return capBytes
}

// prober is the identification conversation with the LUN over one executor: one request slot,
// every command through the retry policy.
type prober struct {
	d   *Device
	ctx context.Context
	ex  scsi.Executor
	r   *request
}

func (pr *prober) run() error { return pr.d.retry.Execute(pr.ctx, pr.ex, &pr.r.cmd, &pr.r.resp) }

// notFound turns LOGICAL UNIT NOT SUPPORTED into ErrLUNNotFound, naming the LUNs there are.
func (pr *prober) notFound(err error) error {
	var se *scsi.SenseError
	if errors.As(err, &se) && se.Key == scsi.KeyIllegalRequest && se.Code() == scsi.ASCLUNotSupported {
		return fmt.Errorf("iser: LUN %d: %w%s: %w", pr.d.info.LUN, ErrLUNNotFound, pr.d.availableLUNs(pr.ctx, pr.ex), err)
	}
	return err
}

// converse asks the LUN, in order: who it is and whether it is ready, its VPD pages, its
// capacity, its mode parameters and whether WRITE SAME(16) exists.
func (pr *prober) converse(opts Options) (probeReport, error) {
	var rep probeReport
	if err := pr.identify(); err != nil {
		return rep, err
	}
	pr.readVPD(&rep)
	if err := pr.readCapacity(&rep); err != nil {
		return rep, err
	}
	pr.modeSense(&rep)
	pr.writeSameSupport(&rep)
	return rep, nil
}

// identify runs INQUIRY and TEST UNIT READY. INQUIRY goes first: it is answered even when a UNIT
// ATTENTION is pending and tells whether the LUN exists at all (SPC-5 §6.6.2: PERIPHERAL
// QUALIFIER 011b means no logical unit). TEST UNIT READY then consumes pending UNIT ATTENTIONs
// (the retry policy re-issues) and fails on a unit that is not ready (no medium, fenced).
func (pr *prober) identify() error {
	d := pr.d
	buf := make([]byte, 96)
	pr.r.cmd.Inquiry(buf)
	if err := pr.run(); err != nil {
		return fmt.Errorf("iser: INQUIRY: %w", pr.notFound(err))
	}
	inq, err := scsi.ParseInquiry(received(buf, pr.r))
	if err != nil {
		return fmt.Errorf("iser: %w", err)
	}
	if inq.Qualifier == 3 || (inq.Qualifier != 0 && inq.DeviceType == scsi.TypeNone) {
		return fmt.Errorf("iser: LUN %d: %w%s", d.info.LUN, ErrLUNNotFound, d.availableLUNs(pr.ctx, pr.ex))
	}
	if inq.DeviceType != scsi.TypeDisk {
		return fmt.Errorf("iser: LUN %d has peripheral device type 0x%02x: %w", d.info.LUN, inq.DeviceType, ErrNotDisk)
	}
	d.info.Vendor, d.info.Product, d.info.Revision = inq.Vendor, inq.Product, inq.Revision
	d.alua = inq.TPGS != 0 // alua.go: paths are ranked by their port group's access state

	pr.r.cmd.TestUnitReady()
	if err := pr.run(); err != nil {
		return fmt.Errorf("iser: TEST UNIT READY: %w", pr.notFound(err))
	}
	return nil
}

// readVPD reads the VPD pages the LUN lists (all optional: a failed page leaves its defaults):
// unit serial number and device identification into d.info, Block Limits, Block Device
// Characteristics and Logical Block Provisioning into rep.
func (pr *prober) readVPD(rep *probeReport) {
	d := pr.d
	pages := []byte{scsi.VPDUnitSerialNumber, scsi.VPDDeviceIdentification}
	if b, err := pr.vpd(scsi.VPDSupportedPages, 256); err == nil {
		if p, err := scsi.ParseSupportedVPDPages(b); err == nil {
			pages = p
		}
	}
	if slices.Contains(pages, scsi.VPDUnitSerialNumber) {
		if b, err := pr.vpd(scsi.VPDUnitSerialNumber, 256); err == nil {
			d.info.Serial, _ = scsi.ParseUnitSerial(b)
		} else {
			d.log.Debug("unit serial number VPD failed", zap.Error(err))
		}
	}
	if slices.Contains(pages, scsi.VPDDeviceIdentification) {
		if b, err := pr.vpd(scsi.VPDDeviceIdentification, 1024); err == nil {
			d.info.Designators, _ = scsi.ParseDeviceIdentification(b)
			d.info.WWN = preferredDesignator(d.info.Designators)
		} else {
			d.log.Debug("device identification VPD failed", zap.Error(err))
		}
	}
	if slices.Contains(pages, scsi.VPDBlockLimits) {
		if b, err := pr.vpd(scsi.VPDBlockLimits, 64); err == nil {
			if rep.blockLimits, err = scsi.ParseBlockLimits(b); err != nil {
				d.log.Debug("block limits VPD undecodable", zap.Error(err))
			}
		} else {
			d.log.Debug("block limits VPD failed", zap.Error(err))
		}
	}
	if slices.Contains(pages, scsi.VPDBlockCharacteristics) {
		if b, err := pr.vpd(scsi.VPDBlockCharacteristics, 64); err == nil {
			if bc, err := scsi.ParseBlockCharacteristics(b); err == nil {
				rep.rotational = bc.Rotational()
			}
		}
	}
	if slices.Contains(pages, scsi.VPDLogicalBlockProvisn) {
		if b, err := pr.vpd(scsi.VPDLogicalBlockProvisn, 64); err == nil {
			rep.lbp, err = scsi.ParseLogicalBlockProvisioning(b)
			rep.haveLBP = err == nil
		}
	}
}

// readCapacity runs READ CAPACITY(16), falling back to (10) for targets that predate it (SBC-4
// §4.6), and checks the answer.
func (pr *prober) readCapacity(rep *probeReport) error {
	capBuf := make([]byte, 32)
	pr.r.cmd.ReadCapacity16(capBuf)
	var c scsi.Capacity
	if err := pr.run(); err == nil {
		c, err = scsi.ParseReadCapacity16(received(capBuf, pr.r))
		if err != nil {
			return fmt.Errorf("iser: %w", err)
		}
		rep.use16 = true
	} else {
		if !errors.Is(err, block.ErrNotSupported) && !errors.Is(err, block.ErrInvalid) {
			return fmt.Errorf("iser: %w", err)
		}
		pr.r.cmd.ReadCapacity10(capBuf[:8])
		if err := pr.run(); err != nil {
			return fmt.Errorf("iser: %w", err)
		}
		if c, err = scsi.ParseReadCapacity10(capBuf[:8]); err != nil {
			return fmt.Errorf("iser: %w", err)
		}
		if c.LastLBA == scsi.ReadCapacity10Exceeded {
			return fmt.Errorf("iser: LUN too large for READ CAPACITY(10) and READ CAPACITY(16) failed: %w", block.ErrNotSupported)
		}
	}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("iser: %w: %w", err, block.ErrIO)
	}
	rep.capacity = c
	return nil
}

// modeSense runs MODE SENSE(10): WP and DPOFUA from the header, WCE from the caching page. A
// target without it gets the safe assumptions (see deriveLimits): writable (writes fail cleanly
// if not), no FUA (emulated), a volatile cache (flushes are sent).
func (pr *prober) modeSense(rep *probeReport) {
	for _, page := range []byte{scsi.ModePageCaching, scsi.ModePageAll} {
		mbuf := make([]byte, 255)
		pr.r.cmd.ModeSense10(page, 0, scsi.PCCurrent, true, mbuf)
		if err := pr.run(); err != nil {
			pr.d.log.Debug("MODE SENSE(10) failed", zap.Uint8("page", page), zap.Error(err))
			continue
		}
		ms, err := scsi.ParseModeSense10(received(mbuf, pr.r))
		if err == nil {
			rep.mode, rep.modeOK = ms, true
			return
		}
	}
}

// writeSameSupport asks whether WRITE SAME(16) exists and NDOB is honoured (REPORT SUPPORTED
// OPERATION CODES, SPC-5 §6.34, one-command format); LBPWS already says yes.
func (pr *prober) writeSameSupport(rep *probeReport) {
	rep.writeSame = wsUnknown
	if rep.haveLBP && rep.lbp.LBPWS {
		rep.writeSame = wsYes
	}
	if rep.mode.WriteProtect {
		return
	}
	rbuf := make([]byte, 4+16)
	pr.r.cmd.ReportSupportedOpcode(scsi.OpWriteSame16, nil, rbuf)
	if err := pr.run(); err != nil {
		return
	}
	if o, err := scsi.ParseOpcodeSupport(received(rbuf, pr.r)); err == nil {
		switch {
		case o.Supported():
			rep.writeSame = wsYes
			rep.ndob = o.UsageBit(1, 0x01)
		case o.Support == 1:
			rep.writeSame = wsNo
		}
	}
}

// apply stores what the probe found and derived in d and d.info.
func (d *Device) apply(rep probeReport, lim derivedLimits) {
	c := rep.capacity
	d.use16 = rep.use16
	d.ndob.Store(rep.ndob)
	d.ws.Store(rep.writeSame)
	d.bs = int64(c.BlockSize)
	d.shift = lim.shift
	d.blocks = c.Blocks()
	d.size = int64(c.Bytes())
	d.maxXferBlocks = lim.maxXferBlocks
	d.lbprz, d.lbpu, d.lbpws = lim.lbprz, lim.lbpu, lim.lbpws
	d.maxUnmapBlocks, d.maxWSBlocks = lim.maxUnmapBlocks, lim.maxWSBlocks
	d.volatile = lim.volatile
	d.limits = lim.limits
	l := lim.limits

	d.info.Blocks = d.blocks
	d.info.Capacity = d.size
	d.info.LogicalBlockSize = c.BlockSize
	d.info.PhysicalBlockSize = l.PhysicalBlockSize
	d.info.MaxTransfer = l.MaxTransfer
	d.info.OptimalTransfer = l.OptimalTransfer
	d.info.ThinProvisioned = c.LBPME
	d.info.UnmapSupported = d.lbpu
	d.info.WriteSameUnmap = d.lbpws
	d.info.ZeroesAfterUnmap = d.lbprz
	d.info.WriteSame = map[int32]string{wsUnknown: "unknown", wsYes: "yes", wsNo: "no"}[rep.writeSame]
	d.info.WriteCache = d.volatile
	d.info.WriteCacheKnown = rep.modeOK && rep.mode.CachingPage
	d.info.FUA = rep.mode.DPOFUA
	d.info.Rotational = rep.rotational
	d.info.ReadOnly = rep.mode.WriteProtect // the LUN's own state, not Options.ReadOnly
	d.log.Debug("probed LUN",
		zap.String("vendor", d.info.Vendor), zap.String("product", d.info.Product),
		zap.Uint64("blocks", d.blocks), zap.Uint32("block_size", c.BlockSize),
		zap.Int64("max_transfer", l.MaxTransfer), zap.Bool("fua", l.CanFUA),
		zap.Bool("write_cache", d.volatile), zap.Bool("read_only", l.ReadOnly),
		zap.Bool("unmap", d.lbpu), zap.Bool("ws_unmap", d.lbpws), zap.String("write_same", d.info.WriteSame), zap.Bool("ndob", d.ndob.Load()))
}

// vpd reads one VPD page into a fresh buffer of n bytes and returns what was transferred.
func (pr *prober) vpd(page byte, n int) ([]byte, error) {
	b := make([]byte, n)
	pr.r.cmd.InquiryVPD(page, b)
	if err := pr.run(); err != nil {
		return nil, err
	}
	return received(b, pr.r), nil
}

// preferredDesignator picks the logical unit's name for people, the way Linux picks a WWN:
// NAA IEEE Registered Extended (6), NAA IEEE Registered (5), NAA IEEE Extended (2), EUI-64, UUID,
// SCSI name, NAA locally assigned (3), T10 vendor ID.
func preferredDesignator(ds []scsi.Designator) string {
	rank := func(d scsi.Designator) int {
		switch d.Type {
		case scsi.DesigNAA:
			if len(d.Value) == 0 {
				return 0
			}
			switch d.Value[0] >> 4 {
			case 6:
				return 9
			case 5:
				return 8
			case 2:
				return 7
			case 3:
				return 3
			}
			return 2
		case scsi.DesigEUI64:
			return 6
		case scsi.DesigUUID:
			return 5
		case scsi.DesigSCSIName:
			return 4
		case scsi.DesigT10:
			return 1
		}
		return 0
	}
	best, bestRank := "", 0
	for _, d := range ds {
		if d.Association != scsi.AssocLU {
			continue
		}
		if r := rank(d); r > bestRank {
			best, bestRank = d.String(), r
		}
	}
	return best
}

// received is the part of a data-in buffer the target filled, from the residual (RFC 7143
// §11.4.5). A residual larger than the buffer (a lying target) leaves nothing.
func received(buf []byte, r *request) []byte {
	res := r.resp.Residual
	if res <= 0 {
		return buf
	}
	if res >= int64(len(buf)) {
		return buf[:0]
	}
	return buf[:int64(len(buf))-res]
}

// availableLUNs asks the target (REPORT LUNS to LUN 0, which SPC-5 §6.33 requires to answer)
// which LUNs exist, for the "not found" message: " (the target has LUNs 0, 1)", or "".
func (d *Device) availableLUNs(ctx context.Context, ex scsi.Executor) string {
	r := &request{}
	buf := make([]byte, 8+8*256)
	r.cmd.ReportLUNs(0, buf)
	if err := d.retry.Execute(ctx, ex, &r.cmd, &r.resp); err != nil {
		return ""
	}
	luns, _, err := scsi.ParseReportLUNs(received(buf, r))
	if err != nil || len(luns) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(" (the target has LUN")
	if len(luns) > 1 {
		b.WriteString("s")
	}
	for i, l := range luns {
		if i > 0 {
			b.WriteString(",")
		}
		if n, ok := scsi.DecodeLUN(l); ok {
			fmt.Fprintf(&b, " %d", n)
		} else {
			fmt.Fprintf(&b, " 0x%016x", l)
		}
	}
	b.WriteString(")")
	return b.String()
}
