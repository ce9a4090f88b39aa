// Package iser is the backend block.Device: a remote SCSI logical unit reached over one or more
// iSCSI sessions (transport TCP or iSER, chosen by the URL scheme).
//
// Open logs in, probes the LUN once (TEST UNIT READY, INQUIRY and its VPD pages, READ CAPACITY,
// MODE SENSE, REPORT SUPPORTED OPERATION CODES) and derives block.Limits from what the target
// reports, never from assumptions. Requests larger than one command may carry (the LUN's
// MAXIMUM TRANSFER LENGTH, a transport cap, the 10-byte CDB limit) are split and the pieces run
// concurrently, spread over the sessions by least outstanding commands; a session that is down is
// skipped, and a command its connection loss failed is re-issued on another. Features the LUN lacks
// are emulated: FUA by WRITE + SYNCHRONIZE CACHE, WRITE ZEROES by writing zero buffers.
//
// Over sessions (recoverable executors) the device also keeps its paths alive: keepalive, a
// command watchdog, session reinstatement, re-issue of the commands a connection loss failed
// (in order of arrival), a replacement timeout, failover between portals and ALUA preference
// (recovery.go, replay.go, alua.go; docs/reliability.md).
//
// SubmitAt (submit.go) is the asynchronous form of a one-command ReadAt/WriteAt for frontends that
// serve many requests from one goroutine: the first attempt completes on the session's reader,
// anything but a final answer falls back to the synchronous path with all of the above.
//
// The public surface is what cmd/iser-blk and the tests use: Open, NewDevice, Options, the
// target URL (ParseURL), Discover, UsePool, CHAP and the sentinel errors. The protocol lives
// under internal/: pdu (the RFC 7143 codec), login, session (the full-feature phase),
// transport (TCP), rdma (iSER, RFC 7145) and discovery (SendTargets). scsi (commands, sense)
// stays public because NewDevice takes scsi.Executors; iscsitest is an in-process target for
// tests.
//
// Invariants: every request is range-checked (block.CheckRange) before anything is sent; every
// error wraps exactly one block sentinel; the single-command hot path (ReadAt/WriteAt within the
// limits) allocates nothing: commands and responses come from a free list.
package iser

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
)

// transferLimiter is implemented by an Executor whose transport caps the data one SCSI command
// may carry (tgt's iSER target fails commands over 512 KiB). The Device splits requests below
// the smallest cap of all its sessions.
type transferLimiter interface {
	MaxCommandData() int64
}

// Default request caps used when the LUN reports none.
const (
	// defaultMaxTransfer bounds a command when Block Limits says nothing: large enough for
	// throughput, small enough that a target without stated limits accepts it.
	defaultMaxTransfer = 8 << 20
	// maxSaneTransfer caps what a target's Block Limits page may claim (see probe).
	maxSaneTransfer = 32 << 20
	// defaultMaxWriteSameBlocks is Linux sd's WRITE SAME(16) cap when the LUN reports none.
	defaultMaxWriteSameBlocks = 0x7FFFFF
	// maxFanout bounds the pieces of one split request in flight at once.
	maxFanout = 32
	// zeroBufMax bounds the shared zero buffer of the write-zeroes emulation.
	zeroBufMax = 1 << 20
)

// wsState is what is known about WRITE SAME(16) support.
const (
	wsUnknown int32 = iota // try it; an INVALID OPERATION CODE settles it
	wsYes
	wsNo
)

// request is a free-listed command slot: the Command, its Response and room for a one-descriptor
// UNMAP parameter list.
type request struct {
	cmd   scsi.Command
	resp  scsi.Response
	param [24]byte
	dev   *Device
	async asyncReq // a request started by SubmitAt (submit.go)
}

// Device is a block.Device over a remote LUN.
type Device struct {
	paths  []*path
	rr     atomic.Uint32 // rotates the start of the least-outstanding scan so ties spread
	lun    uint64        // encoded SAM LUN
	log    *zap.Logger
	retry  *scsi.RetryPolicy
	closer func() error // logs the sessions out

	info   Info
	limits block.Limits
	size   int64
	bs     int64
	shift  uint // log2(bs)
	blocks uint64

	maxXferBlocks  uint64 // per READ/WRITE command
	maxUnmapBlocks uint64 // per UNMAP / discard WRITE SAME
	maxWSBlocks    uint64 // per WRITE SAME
	use16          bool   // READ/WRITE(16); else (10)
	volatile       bool   // a write cache that SYNCHRONIZE CACHE must flush
	lbpu, lbpws    bool
	lbprz          bool
	ws             atomic.Int32 // wsUnknown / wsYes / wsNo
	ndob           atomic.Bool  // WRITE SAME(16) NDOB is honoured
	sync10         atomic.Bool  // SYNCHRONIZE CACHE(16) was rejected: use (10)

	free     sync.Pool
	zeroOnce sync.Once
	zeroBuf  []byte

	closed atomic.Bool

	rec        Recovery
	recovering bool // some path is recoverable: commands wait for a path instead of failing
	state      pathState
	bg         context.Context // the maintainers' life; nil without recoverable paths
	bgCancel   context.CancelFunc
	bgWG       sync.WaitGroup

	seq     atomic.Uint64 // arrival numbers of commands (replay.go)
	replays replayQueue

	alua     bool        // INQUIRY TPGS != 0
	aluaBusy atomic.Bool // a refresh is running
	aluaWG   sync.WaitGroup
}

var _ block.Device = (*Device)(nil)

// NewDevice builds a Device over already logged-in executors (sessions to the same target; or
// a scsitest LUN in tests) for LUN lun, probing the LUN through the first one. closer, if not
// nil, is called by Close (e.g. to log the sessions out). opts supplies the logger, retry policy
// and transfer cap; the login fields are ignored.
func NewDevice(ctx context.Context, execs []scsi.Executor, lun uint16, opts Options, closer func() error) (*Device, error) {
	if len(execs) == 0 {
		return nil, fmt.Errorf("iser: no sessions: %w", block.ErrInvalid)
	}
	d := &Device{
		lun:    scsi.EncodeLUN(lun),
		log:    opts.logger(),
		closer: closer,
	}
	// Every UNIT ATTENTION is logged (capacity changed, LUN reset, mode parameters changed...)
	// before the command is re-issued: the device keeps working, but an operator should know.
	policy := scsi.RetryPolicy{}
	if opts.Retry != nil {
		policy = *opts.Retry
	}
	if policy.OnUnitAttention == nil {
		log := d.log
		policy.OnUnitAttention = func(cmd *scsi.Command, resp *scsi.Response) {
			err := scsi.CheckCommand(cmd, resp)
			// "Power on, reset or bus device reset occurred" (29h) is what every target reports
			// to a new I_T nexus: expected after each login, so it is not a warning.
			var se *scsi.SenseError
			if errors.As(err, &se) && (se.ASC == 0x29 || se.ASC == 0x2A && se.ASCQ == 0x06) {
				// After a reset, or "asymmetric access state changed": re-read the port groups.
				d.kickALUA()
			}
			if errors.As(err, &se) && se.ASC == 0x29 {
				log.Info("unit attention", zap.Error(err))
				return
			}
			log.Warn("unit attention", zap.Error(err))
		}
	}
	d.retry = &policy
	d.rec = DefaultRecovery()
	if opts.Recovery != nil {
		d.rec = *opts.Recovery
	}
	d.rec.normalize()
	d.state.changed = make(chan struct{})
	for i, ex := range execs {
		p := &path{ex: ex, name: fmt.Sprintf("path%d", i)}
		p.aluaState.Store(-1)
		p.tpg.Store(-1)
		if i < len(opts.pathNames) {
			p.name = opts.pathNames[i]
		}
		p.liveness, _ = ex.(connectedExecutor)
		p.rec, _ = ex.(recoverableExecutor)
		d.recovering = d.recovering || p.rec != nil
		d.paths = append(d.paths, p)
	}
	d.free.New = func() any { return &request{} }
	if d.recovering {
		d.startRecovery()
	}
	if err := d.probe(ctx, opts); err != nil {
		d.stopRecovery()
		return nil, err
	}
	if d.alua {
		d.aluaWG.Wait() // a refresh kicked by the probe's UNIT ATTENTION: let it finish, then read now
		if err := d.refreshALUA(ctx); err != nil {
			d.log.Warn("ALUA: cannot read the target port groups; all paths are treated alike", zap.Error(err))
		}
	}
	return d, nil
}

// Size implements block.Device.
func (d *Device) Size() int64 { return d.size }

// BlockSize implements block.Device.
func (d *Device) BlockSize() int { return int(d.bs) }

// Limits implements block.Device.
func (d *Device) Limits() block.Limits { return d.limits }

// Info returns what the probe found.
func (d *Device) Info() Info { return d.info }

func (d *Device) get() *request {
	r := d.free.Get().(*request)
	r.cmd.LUN = d.lun
	return r
}

func (d *Device) put(r *request) {
	r.cmd.Data = nil // never keep a caller's buffer
	d.free.Put(r)
}

// Close implements block.Device: it logs the sessions out. Callers drain their requests first.
func (d *Device) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	d.stopRecovery() // no reinstatement races the logout
	d.aluaWG.Wait()
	var errs []error
	if d.closer != nil {
		if err := d.closer(); err != nil {
			errs = append(errs, err)
		}
	} else {
		for _, p := range d.paths {
			if c, ok := p.ex.(io.Closer); ok {
				if err := c.Close(); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return opError("close", 0, 0, err)
	}
	return nil
}
