// Package scsitest is an in-memory SCSI logical unit that implements scsi.Executor, so that the
// device layer, the cache and the frontends can be tested without a target process.
//
// The fake is strict on purpose: it checks every CDB the way a picky target does (LBA range,
// MAXIMUM TRANSFER LENGTH, UNMAP and WRITE SAME limits, buffer length against the transfer
// length, write protection) and answers with the sense a real target would send, so a bug in a
// caller shows up as a failed command rather than silently succeeding. Storage is sparse
// (64 KiB chunks allocated on first write), so large capacities cost nothing until written.
// Faults (any status or sense, or an Executor error) can be injected per operation code, a
// UNIT ATTENTION can be made pending, a Hook can hold commands to observe concurrency, and an
// optional operation log records what was executed.
//
// It is public, like net/http/httptest, because tests outside backend/iser use it: frontend/nbd's
// integration test and test/e2e/recovery serve a scsitest LUN through iser.NewDevice or
// backend/iser/iscsitest.
package scsitest

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"

	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

const chunkSize = 64 << 10

// Config describes the fake LUN. The zero value is a 512-byte-block, 64 MiB disk with no limits,
// no volatile cache and no thin provisioning.
type Config struct {
	BlockSize         uint32 // logical block size (default 512)
	Blocks            uint64 // capacity in logical blocks (default 64 MiB worth)
	PhysBlockExponent uint8  // physical block = BlockSize << PhysBlockExponent

	ReadOnly bool // MODE SENSE WP; writes fail with DATA PROTECT / WRITE PROTECTED
	DPOFUA   bool // MODE SENSE DPOFUA: FUA is honoured
	WCE      bool // caching page WCE: a volatile write cache

	Thin   bool // READ CAPACITY(16) LBPME
	LBPU   bool // UNMAP supported
	LBPWS  bool // WRITE SAME(16) with UNMAP supported
	LBPRZ  bool // unmapped blocks read as zeroes (else they read as 0xDB to catch wrong assumptions)
	NoNDOB bool // WRITE SAME(16) rejects NDOB

	MaxTransferBlocks     uint32 // Block Limits MAXIMUM TRANSFER LENGTH (0: none)
	OptimalTransferBlocks uint32
	MaxUnmapLBACount      uint32
	MaxUnmapDescriptors   uint32
	UnmapGranularity      uint32
	MaxWriteSameBlocks    uint64

	NoWriteSame      bool // WRITE SAME(10/16) are invalid operation codes
	NoReadCapacity16 bool // READ CAPACITY(16) is an invalid operation code
	No16ByteRW       bool // READ/WRITE/SYNCHRONIZE CACHE(16) are invalid operation codes
	NoModeSense      bool // MODE SENSE(10) is an invalid operation code
	NoBlockLimitsVPD bool // page 0xB0 not offered
	NoLBPVPD         bool // page 0xB2 not offered
	NoRSOC           bool // REPORT SUPPORTED OPERATION CODES is an invalid operation code

	RotationRate uint16 // VPD 0xB1 MEDIUM ROTATION RATE (0: page not offered)

	DeviceType uint8 // peripheral device type (default 0: disk)
	LUN        uint16
	Vendor     string // default "ISERTEST"
	Product    string // default "FAKE LUN"
	Revision   string // default "0001"
	Serial     string // default "fake0001"
	NAA        []byte // 8 or 16 bytes (default a fixed NAA 6 identifier)

	Log bool // record every executed command (allocates; leave off in benchmarks)
}

// Op is one executed command in the operation log.
type Op struct {
	Opcode  byte
	Name    string
	LBA     uint64
	Blocks  uint64
	FUA     bool
	Unmap   bool
	NDOB    bool
	DataLen int
	Status  scsi.Status
}

// Fault is an injected failure for commands with a given operation code.
type Fault struct {
	Opcode int // operation code to match; -1 matches every command
	Times  int // how many commands it hits (0: one)
	// Err, if set, is returned by Execute (a transport failure); otherwise the command completes
	// with Status (default CHECK CONDITION) and, for CHECK CONDITION, the sense below.
	Err       error
	Status    scsi.Status
	Key       scsi.SenseKey
	ASC, ASCQ uint8
	// Descriptor makes the sense descriptor-format (0x72) instead of fixed (0x70).
	Descriptor bool
}

// LUN is the fake logical unit. It is safe for concurrent use.
type LUN struct {
	cfg Config
	// Hook, if set, runs before each command outside the LUN's lock; it may block (to hold
	// commands in flight) or return an error that Execute returns.
	Hook func(ctx context.Context, cmd *scsi.Command) error

	mu     sync.Mutex
	chunks map[uint64][]byte
	faults []Fault
	ua     []uint16 // pending UNIT ATTENTIONs as ASC<<8|ASCQ
	ops    []Op

	inflight, maxInflight atomic.Int64
	counts                [256]atomic.Int64
}

// New returns a fake LUN with cfg's defaults filled in.
func New(cfg Config) *LUN {
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 512
	}
	if cfg.Blocks == 0 {
		cfg.Blocks = (64 << 20) / uint64(cfg.BlockSize)
	}
	if cfg.Vendor == "" {
		cfg.Vendor = "ISERTEST"
	}
	if cfg.Product == "" {
		cfg.Product = "FAKE LUN"
	}
	if cfg.Revision == "" {
		cfg.Revision = "0001"
	}
	if cfg.Serial == "" {
		cfg.Serial = "fake0001"
	}
	if cfg.NAA == nil {
		cfg.NAA = []byte{0x60, 0x01, 0x40, 0x50, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0, 0, 0, 0, 1}
	}
	return &LUN{cfg: cfg, chunks: map[uint64][]byte{}}
}

// Config returns the configuration in effect.
func (l *LUN) Config() Config { return l.cfg }

// InjectFault queues f; faults are consumed in order of injection.
func (l *LUN) InjectFault(f Fault) {
	if f.Times <= 0 {
		f.Times = 1
	}
	if f.Status == 0 && f.Err == nil {
		f.Status = scsi.StatusCheckCondition
	}
	l.mu.Lock()
	l.faults = append(l.faults, f)
	l.mu.Unlock()
}

// SetUnitAttention makes a UNIT ATTENTION with asc/ascq pending: the next command other than
// INQUIRY and REPORT LUNS completes with it (SAM-5 §5.14).
func (l *LUN) SetUnitAttention(asc, ascq uint8) {
	l.mu.Lock()
	l.ua = append(l.ua, uint16(asc)<<8|uint16(ascq))
	l.mu.Unlock()
}

// Ops returns a copy of the operation log.
func (l *LUN) Ops() []Op {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Op(nil), l.ops...)
}

// ResetOps clears the operation log and the per-opcode counters.
func (l *LUN) ResetOps() {
	l.mu.Lock()
	l.ops = nil
	l.mu.Unlock()
	for i := range l.counts {
		l.counts[i].Store(0)
	}
	l.maxInflight.Store(0)
}

// Count returns how many commands with operation code op completed (any status).
func (l *LUN) Count(op byte) int64 { return l.counts[op].Load() }

// MaxInflight is the largest number of commands executing at once since the last ResetOps.
func (l *LUN) MaxInflight() int64 { return l.maxInflight.Load() }

// Bytes returns a copy of the stored bytes in [off, off+n).
func (l *LUN) Bytes(off, n int64) []byte {
	out := make([]byte, n)
	l.mu.Lock()
	l.readLocked(out, uint64(off))
	l.mu.Unlock()
	return out
}

// Execute implements scsi.Executor.
func (l *LUN) Execute(ctx context.Context, cmd *scsi.Command, resp *scsi.Response) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n := l.inflight.Add(1)
	defer l.inflight.Add(-1)
	for {
		m := l.maxInflight.Load()
		if n <= m || l.maxInflight.CompareAndSwap(m, n) {
			break
		}
	}
	if l.Hook != nil {
		if err := l.Hook(ctx, cmd); err != nil {
			return err
		}
	}
	resp.Reset()
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.injectLocked(cmd, resp); err != nil {
		return err
	}
	if resp.Status == scsi.StatusGood {
		l.executeLocked(cmd, resp)
	}
	l.counts[cmd.CDB[0]].Add(1)
	if l.cfg.Log {
		l.ops = append(l.ops, describe(cmd, resp.Status))
	}
	return nil
}

func (l *LUN) injectLocked(cmd *scsi.Command, resp *scsi.Response) error {
	op := cmd.CDB[0]
	for i := range l.faults {
		f := &l.faults[i]
		if f.Opcode != -1 && f.Opcode != int(op) {
			continue
		}
		f.Times--
		fault := *f
		if f.Times <= 0 {
			l.faults = append(l.faults[:i], l.faults[i+1:]...)
		}
		if fault.Err != nil {
			return fault.Err
		}
		resp.Status = fault.Status
		if fault.Status == scsi.StatusCheckCondition {
			setSense(resp, fault.Key, fault.ASC, fault.ASCQ, fault.Descriptor)
		}
		return nil
	}
	if len(l.ua) > 0 && op != scsi.OpInquiry && op != scsi.OpReportLUNs {
		code := l.ua[0]
		l.ua = l.ua[1:]
		resp.SetSense(scsi.KeyUnitAttention, uint8(code>>8), uint8(code))
	}
	return nil
}

func setSense(resp *scsi.Response, key scsi.SenseKey, asc, ascq uint8, descriptor bool) {
	if !descriptor {
		resp.SetSense(key, asc, ascq)
		return
	}
	resp.Status = scsi.StatusCheckCondition
	resp.Sense = [scsi.MaxSense]byte{}
	resp.Sense[0] = 0x72
	resp.Sense[1] = byte(key)
	resp.Sense[2] = asc
	resp.Sense[3] = ascq
	resp.SenseLen = 8
}

func describe(cmd *scsi.Command, st scsi.Status) Op {
	op := Op{Opcode: cmd.CDB[0], Name: cmd.Name(), DataLen: len(cmd.Data), Status: st}
	c := cmd.CDB[:]
	switch cmd.CDB[0] {
	case scsi.OpRead10, scsi.OpWrite10, scsi.OpSynchronizeCache10, scsi.OpWriteSame10:
		op.LBA = uint64(binary.BigEndian.Uint32(c[2:6]))
		op.Blocks = uint64(binary.BigEndian.Uint16(c[7:9]))
	case scsi.OpRead16, scsi.OpWrite16, scsi.OpSynchronizeCache16, scsi.OpWriteSame16:
		op.LBA = binary.BigEndian.Uint64(c[2:10])
		op.Blocks = uint64(binary.BigEndian.Uint32(c[10:14]))
	case scsi.OpUnmap:
		if len(cmd.Data) >= 24 {
			op.LBA = binary.BigEndian.Uint64(cmd.Data[8:16])
			for p := 8; p+16 <= len(cmd.Data); p += 16 {
				op.Blocks += uint64(binary.BigEndian.Uint32(cmd.Data[p+8 : p+12]))
			}
		}
	}
	op.FUA = c[1]&0x08 != 0 && (c[0] == scsi.OpRead10 || c[0] == scsi.OpWrite10 || c[0] == scsi.OpRead16 || c[0] == scsi.OpWrite16)
	op.Unmap = c[1]&0x08 != 0 && (c[0] == scsi.OpWriteSame10 || c[0] == scsi.OpWriteSame16)
	op.NDOB = c[1]&0x01 != 0 && c[0] == scsi.OpWriteSame16
	return op
}

func illegal(resp *scsi.Response, code uint16) {
	resp.SetSense(scsi.KeyIllegalRequest, uint8(code>>8), uint8(code))
}

func (l *LUN) executeLocked(cmd *scsi.Command, resp *scsi.Response) {
	c := cmd.CDB[:]
	switch c[0] {
	case scsi.OpTestUnitReady:
	case scsi.OpInquiry:
		l.inquiry(cmd, resp)
	case scsi.OpReadCapacity10:
		var b [8]byte
		last := l.cfg.Blocks - 1
		if last > 0xFFFFFFFF {
			last = 0xFFFFFFFF
		}
		binary.BigEndian.PutUint32(b[0:4], uint32(last))
		binary.BigEndian.PutUint32(b[4:8], l.cfg.BlockSize)
		dataIn(cmd, resp, b[:])
	case scsi.OpServiceActionIn16:
		if c[1]&0x1F != scsi.SAReadCapacity16 || l.cfg.NoReadCapacity16 {
			illegal(resp, scsi.ASCInvalidOpcode)
			return
		}
		var b [32]byte
		binary.BigEndian.PutUint64(b[0:8], l.cfg.Blocks-1)
		binary.BigEndian.PutUint32(b[8:12], l.cfg.BlockSize)
		b[13] = l.cfg.PhysBlockExponent & 0x0F
		if l.cfg.Thin {
			b[14] |= 0x80
		}
		if l.cfg.LBPRZ {
			b[14] |= 0x40
		}
		alloc := int(binary.BigEndian.Uint32(c[10:14]))
		dataIn(cmd, resp, b[:min(alloc, 32)])
	case scsi.OpRead10, scsi.OpRead16:
		if c[0] == scsi.OpRead16 && l.cfg.No16ByteRW {
			illegal(resp, scsi.ASCInvalidOpcode)
			return
		}
		lba, blocks := rwRange(c)
		if !l.checkRW(cmd, resp, lba, blocks, DirIn) {
			return
		}
		l.readLocked(cmd.Data, lba*uint64(l.cfg.BlockSize))
	case scsi.OpWrite10, scsi.OpWrite16:
		if c[0] == scsi.OpWrite16 && l.cfg.No16ByteRW {
			illegal(resp, scsi.ASCInvalidOpcode)
			return
		}
		lba, blocks := rwRange(c)
		if !l.checkRW(cmd, resp, lba, blocks, DirOut) {
			return
		}
		l.writeLocked(cmd.Data, lba*uint64(l.cfg.BlockSize))
	case scsi.OpSynchronizeCache10, scsi.OpSynchronizeCache16:
		if c[0] == scsi.OpSynchronizeCache16 && l.cfg.No16ByteRW {
			illegal(resp, scsi.ASCInvalidOpcode)
			return
		}
		lba, blocks := rwRange(c)
		if lba > l.cfg.Blocks || blocks > l.cfg.Blocks-lba {
			illegal(resp, scsi.ASCLBAOutOfRange)
		}
	case scsi.OpUnmap:
		l.unmap(cmd, resp)
	case scsi.OpWriteSame10, scsi.OpWriteSame16:
		l.writeSame(cmd, resp)
	case scsi.OpModeSense10:
		l.modeSense(cmd, resp)
	case scsi.OpReportLUNs:
		var b [16]byte
		binary.BigEndian.PutUint32(b[0:4], 8)
		binary.BigEndian.PutUint64(b[8:16], scsi.EncodeLUN(l.cfg.LUN))
		dataIn(cmd, resp, b[:])
	case scsi.OpMaintenanceIn:
		l.rsoc(cmd, resp)
	default:
		illegal(resp, scsi.ASCInvalidOpcode)
	}
}

// Data directions for checkRW.
const (
	DirIn  = 1
	DirOut = 2
)

func rwRange(c []byte) (lba, blocks uint64) {
	switch c[0] {
	case scsi.OpRead10, scsi.OpWrite10, scsi.OpSynchronizeCache10, scsi.OpWriteSame10:
		return uint64(binary.BigEndian.Uint32(c[2:6])), uint64(binary.BigEndian.Uint16(c[7:9]))
	}
	return binary.BigEndian.Uint64(c[2:10]), uint64(binary.BigEndian.Uint32(c[10:14]))
}

// checkRW validates a READ or WRITE the way SBC-4 §4.5 and §5.15 require.
func (l *LUN) checkRW(cmd *scsi.Command, resp *scsi.Response, lba, blocks uint64, dir int) bool {
	if dir == DirOut && l.cfg.ReadOnly {
		resp.SetSense(scsi.KeyDataProtect, 0x27, 0x00)
		return false
	}
	if lba > l.cfg.Blocks || blocks > l.cfg.Blocks-lba {
		illegal(resp, scsi.ASCLBAOutOfRange)
		return false
	}
	if l.cfg.MaxTransferBlocks != 0 && blocks > uint64(l.cfg.MaxTransferBlocks) {
		illegal(resp, scsi.ASCInvalidFieldInCDB)
		return false
	}
	want := blocks * uint64(l.cfg.BlockSize)
	if uint64(len(cmd.Data)) != want || (dir == DirIn) != (cmd.Dir == scsi.DirRead) || (dir == DirOut) != (cmd.Dir == scsi.DirWrite) {
		// The expected data transfer length disagrees with the CDB: a caller bug that a real
		// target would answer with a residual or a protocol error. Fail loudly.
		illegal(resp, scsi.ASCInvalidFieldInCDB)
		return false
	}
	return true
}

func dataIn(cmd *scsi.Command, resp *scsi.Response, b []byte) {
	n := copy(cmd.Data, b)
	resp.Residual = int64(len(cmd.Data) - n)
}

func (l *LUN) readLocked(p []byte, off uint64) {
	for len(p) > 0 {
		idx, in := off/chunkSize, off%chunkSize
		n := min(uint64(len(p)), chunkSize-in)
		if ch := l.chunks[idx]; ch != nil {
			copy(p[:n], ch[in:in+n])
		} else {
			clear(p[:n])
		}
		p, off = p[n:], off+n
	}
}

func (l *LUN) writeLocked(p []byte, off uint64) {
	for len(p) > 0 {
		idx, in := off/chunkSize, off%chunkSize
		n := min(uint64(len(p)), chunkSize-in)
		ch := l.chunks[idx]
		if ch == nil {
			ch = make([]byte, chunkSize)
			l.chunks[idx] = ch
		}
		copy(ch[in:in+n], p[:n])
		p, off = p[n:], off+n
	}
}
