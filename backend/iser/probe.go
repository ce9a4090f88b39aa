package iser

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
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

// probe runs the one-time identification of the LUN and fills d's geometry and limits.
func (d *Device) probe(ctx context.Context, opts Options) error {
	r := &request{}
	r.cmd.LUN = d.lun
	ex := d.paths[0].ex
	for _, p := range d.paths {
		if p.up() { // with several portals, the first may be down at start
			ex = p.ex
			break
		}
	}
	run := func() error { return d.retry.Execute(ctx, ex, &r.cmd, &r.resp) }
	notFound := func(err error) error {
		var se *scsi.SenseError
		if errors.As(err, &se) && se.Key == scsi.KeyIllegalRequest && se.Code() == scsi.ASCLUNotSupported {
			return fmt.Errorf("iser: LUN %d: %w%s: %w", d.info.LUN, ErrLUNNotFound, d.availableLUNs(ctx, ex), err)
		}
		return err
	}
	d.info.LUN, _ = scsi.DecodeLUN(d.lun)
	d.info.Sessions = len(d.paths)

	// INQUIRY first: it is answered even when a UNIT ATTENTION is pending and tells whether the
	// LUN exists at all (SPC-5 §6.6.2: PERIPHERAL QUALIFIER 011b means no logical unit).
	buf := make([]byte, 96)
	r.cmd.Inquiry(buf)
	if err := run(); err != nil {
		return fmt.Errorf("iser: INQUIRY: %w", notFound(err))
	}
	inq, err := scsi.ParseInquiry(received(buf, r))
	if err != nil {
		return fmt.Errorf("iser: %w", err)
	}
	if inq.Qualifier == 3 || (inq.Qualifier != 0 && inq.DeviceType == scsi.TypeNone) {
		return fmt.Errorf("iser: LUN %d: %w%s", d.info.LUN, ErrLUNNotFound, d.availableLUNs(ctx, ex))
	}
	if inq.DeviceType != scsi.TypeDisk {
		return fmt.Errorf("iser: LUN %d has peripheral device type 0x%02x: %w", d.info.LUN, inq.DeviceType, ErrNotDisk)
	}
	d.info.Vendor, d.info.Product, d.info.Revision = inq.Vendor, inq.Product, inq.Revision
	d.alua = inq.TPGS != 0 // alua.go: paths are ranked by their port group's access state

	// TEST UNIT READY consumes pending UNIT ATTENTIONs (the retry policy re-issues) and fails
	// on a unit that is not ready (no medium, fenced).
	r.cmd.TestUnitReady()
	if err := run(); err != nil {
		return fmt.Errorf("iser: TEST UNIT READY: %w", notFound(err))
	}

	pages := []byte{scsi.VPDUnitSerialNumber, scsi.VPDDeviceIdentification}
	if b, err := d.vpd(run, r, scsi.VPDSupportedPages, 256); err == nil {
		if p, err := scsi.ParseSupportedVPDPages(b); err == nil {
			pages = p
		}
	}
	if slices.Contains(pages, scsi.VPDUnitSerialNumber) {
		if b, err := d.vpd(run, r, scsi.VPDUnitSerialNumber, 256); err == nil {
			d.info.Serial, _ = scsi.ParseUnitSerial(b)
		} else {
			d.log.Debug("unit serial number VPD failed", zap.Error(err))
		}
	}
	if slices.Contains(pages, scsi.VPDDeviceIdentification) {
		if b, err := d.vpd(run, r, scsi.VPDDeviceIdentification, 1024); err == nil {
			d.info.Designators, _ = scsi.ParseDeviceIdentification(b)
			d.info.WWN = preferredDesignator(d.info.Designators)
		} else {
			d.log.Debug("device identification VPD failed", zap.Error(err))
		}
	}
	var bl scsi.BlockLimits
	if slices.Contains(pages, scsi.VPDBlockLimits) {
		if b, err := d.vpd(run, r, scsi.VPDBlockLimits, 64); err == nil {
			if bl, err = scsi.ParseBlockLimits(b); err != nil {
				d.log.Debug("block limits VPD undecodable", zap.Error(err))
			}
		} else {
			d.log.Debug("block limits VPD failed", zap.Error(err))
		}
	}
	var rotational bool
	if slices.Contains(pages, scsi.VPDBlockCharacteristics) {
		if b, err := d.vpd(run, r, scsi.VPDBlockCharacteristics, 64); err == nil {
			if bc, err := scsi.ParseBlockCharacteristics(b); err == nil {
				rotational = bc.Rotational()
			}
		}
	}
	var lbp scsi.LogicalBlockProvisioning
	haveLBP := false
	if slices.Contains(pages, scsi.VPDLogicalBlockProvisn) {
		if b, err := d.vpd(run, r, scsi.VPDLogicalBlockProvisn, 64); err == nil {
			lbp, err = scsi.ParseLogicalBlockProvisioning(b)
			haveLBP = err == nil
		}
	}

	// READ CAPACITY(16), falling back to (10) for targets that predate it (SBC-4 §4.6).
	capBuf := make([]byte, 32)
	r.cmd.ReadCapacity16(capBuf)
	var c scsi.Capacity
	if err := run(); err == nil {
		c, err = scsi.ParseReadCapacity16(received(capBuf, r))
		if err != nil {
			return fmt.Errorf("iser: %w", err)
		}
		d.use16 = true
	} else {
		if !errors.Is(err, block.ErrNotSupported) && !errors.Is(err, block.ErrInvalid) {
			return fmt.Errorf("iser: %w", err)
		}
		r.cmd.ReadCapacity10(capBuf[:8])
		if err := run(); err != nil {
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
	d.bs = int64(c.BlockSize)
	d.shift = uint(bits.TrailingZeros32(c.BlockSize))
	d.blocks = c.Blocks()
	d.size = int64(c.Bytes())

	// MODE SENSE(10): WP and DPOFUA from the header, WCE from the caching page. A target
	// without it gets the safe assumptions: writable (writes fail cleanly if not), no FUA
	// (emulated), a volatile cache (flushes are sent).
	var ms scsi.ModeSense
	msOK := false
	for _, page := range []byte{scsi.ModePageCaching, scsi.ModePageAll} {
		mbuf := make([]byte, 255)
		r.cmd.ModeSense10(page, 0, scsi.PCCurrent, true, mbuf)
		if err := run(); err != nil {
			d.log.Debug("MODE SENSE(10) failed", zap.Uint8("page", page), zap.Error(err))
			continue
		}
		if ms, err = scsi.ParseModeSense10(received(mbuf, r)); err == nil {
			msOK = true
			break
		}
	}

	// Does WRITE SAME(16) exist, and is NDOB honoured? (SPC-5 §6.34, one-command format.)
	ws := wsUnknown
	if haveLBP && lbp.LBPWS {
		ws = wsYes
	}
	if !ms.WriteProtect {
		rbuf := make([]byte, 4+16)
		r.cmd.ReportSupportedOpcode(scsi.OpWriteSame16, nil, rbuf)
		if err := run(); err == nil {
			if o, err := scsi.ParseOpcodeSupport(received(rbuf, r)); err == nil {
				switch {
				case o.Supported():
					ws = wsYes
					d.ndob.Store(o.UsageBit(1, 0x01))
				case o.Support == 1:
					ws = wsNo
				}
			}
		}
	}
	d.ws.Store(ws)

	// Transfer limits, in blocks.
	maxX := uint64(defaultMaxTransfer) >> d.shift
	if bl.MaxTransferLength != 0 {
		// Some targets report their backstore's limit (LIO's RAM disk: 2 TiB). A command larger
		// than maxSaneTransfer gains no throughput and ties up a huge slice of the caller's
		// memory in one task, so the stated limit is honoured only below it.
		maxX = min(uint64(bl.MaxTransferLength), uint64(maxSaneTransfer)>>d.shift)
	}
	capBytes := opts.MaxTransfer
	for _, p := range d.paths {
		if tl, ok := p.ex.(transferLimiter); ok {
			if m := tl.MaxCommandData(); m > 0 && (capBytes == 0 || m < capBytes) {
				capBytes = m
			}
		}
	}
	if capBytes > 0 {
		maxX = min(maxX, uint64(capBytes)>>d.shift)
	}
	if !d.use16 {
		maxX = min(maxX, 0xFFFF)
	}
	maxX = min(maxX, 0xFFFFFFFF)
	// Keep pieces aligned to physical blocks when that costs nothing.
	if pb := uint64(1) << c.PhysBlockExponent; c.PhysBlockExponent <= 16 && maxX >= 2*pb {
		maxX -= maxX % pb
	}
	if maxX == 0 {
		return fmt.Errorf("iser: transfer cap %d bytes is smaller than a %d-byte block: %w", capBytes, d.bs, block.ErrInvalid)
	}
	d.maxXferBlocks = maxX

	d.lbprz = c.LBPRZ || (haveLBP && lbp.LBPRZ != 0)
	// A Block Limits page long enough to carry the UNMAP limits but with either at zero says
	// UNMAP is not implemented after all (SBC-4 §6.6.4), whatever LBPU claims.
	unmapLimitsZero := bl.Length >= 24 && (bl.MaxUnmapLBACount == 0 || bl.MaxUnmapDescriptorCount == 0)
	d.lbpu = haveLBP && lbp.LBPU && !unmapLimitsZero
	d.lbpws = haveLBP && lbp.LBPWS
	d.maxUnmapBlocks = 0xFFFFFFFF
	if bl.MaxUnmapLBACount != 0 {
		d.maxUnmapBlocks = uint64(bl.MaxUnmapLBACount)
	}
	if !d.lbpu {
		// Discard through WRITE SAME(16) with UNMAP follows WRITE SAME's limit.
		d.maxUnmapBlocks = min(d.maxUnmapBlocks, wsLimit(bl))
	}
	d.maxWSBlocks = wsLimit(bl)
	d.volatile = !msOK || !ms.CachingPage || ms.WCE

	physBS := uint32(c.PhysicalBlockSize())
	if c.PhysBlockExponent > 16 {
		physBS = c.BlockSize
	}
	l := block.Limits{
		LogicalBlockSize:  c.BlockSize,
		PhysicalBlockSize: physBS,
		MaxTransfer:       int64(d.maxXferBlocks) << d.shift,
		OptimalTransfer:   int64(bl.OptimalTransferLength) << d.shift,
		ReadOnly:          ms.WriteProtect || opts.ReadOnly,
		VolatileCache:     d.volatile,
		CanFlush:          true,
		CanFUA:            ms.DPOFUA,
		CanDiscard:        d.lbpu || d.lbpws,
		CanWriteZeroes:    true,
		CanFastZero:       ws != wsNo,
		DiscardZeroes:     d.lbprz && (d.lbpu || d.lbpws),
		Rotational:        rotational,
		MultiConn:         true,
	}
	if l.CanDiscard {
		l.MaxDiscard = int64(d.maxUnmapBlocks) << d.shift
		if bl.OptimalUnmapGranularity > 1 {
			l.DiscardAlignment = int64(bl.OptimalUnmapGranularity) << d.shift
		}
	}
	if ws != wsNo {
		l.MaxWriteZeroes = int64(d.maxWSBlocks) << d.shift
	} else {
		l.MaxWriteZeroes = l.MaxTransfer
	}
	if l.OptimalTransfer > l.MaxTransfer {
		l.OptimalTransfer = l.MaxTransfer
	}
	d.limits = l

	d.info.Blocks = d.blocks
	d.info.Capacity = d.size
	d.info.LogicalBlockSize = c.BlockSize
	d.info.PhysicalBlockSize = physBS
	d.info.MaxTransfer = l.MaxTransfer
	d.info.OptimalTransfer = l.OptimalTransfer
	d.info.ThinProvisioned = c.LBPME
	d.info.UnmapSupported = d.lbpu
	d.info.WriteSameUnmap = d.lbpws
	d.info.ZeroesAfterUnmap = d.lbprz
	d.info.WriteSame = map[int32]string{wsUnknown: "unknown", wsYes: "yes", wsNo: "no"}[ws]
	d.info.WriteCache = d.volatile
	d.info.WriteCacheKnown = msOK && ms.CachingPage
	d.info.FUA = ms.DPOFUA
	d.info.Rotational = rotational
	d.info.ReadOnly = ms.WriteProtect // the LUN's own state, not Options.ReadOnly
	d.log.Debug("probed LUN",
		zap.String("vendor", d.info.Vendor), zap.String("product", d.info.Product),
		zap.Uint64("blocks", d.blocks), zap.Uint32("block_size", c.BlockSize),
		zap.Int64("max_transfer", l.MaxTransfer), zap.Bool("fua", l.CanFUA),
		zap.Bool("write_cache", d.volatile), zap.Bool("read_only", l.ReadOnly),
		zap.Bool("unmap", d.lbpu), zap.Bool("ws_unmap", d.lbpws), zap.String("write_same", d.info.WriteSame), zap.Bool("ndob", d.ndob.Load()))
	return nil
}

func wsLimit(bl scsi.BlockLimits) uint64 {
	if bl.MaxWriteSameLength == 0 {
		return defaultMaxWriteSameBlocks
	}
	return min(bl.MaxWriteSameLength, 0xFFFFFFFF)
}

// vpd reads one VPD page into a fresh buffer of n bytes and returns what was transferred.
func (d *Device) vpd(run func() error, r *request, page byte, n int) ([]byte, error) {
	b := make([]byte, n)
	r.cmd.InquiryVPD(page, b)
	if err := run(); err != nil {
		return nil, err
	}
	return received(b, r), nil
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
