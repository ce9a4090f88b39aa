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
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser/internal/session"
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

// path is one session (or any Executor), its counters and, for a recoverable one, the state its
// maintainer keeps (recovery.go).
type path struct {
	ex          scsi.Executor
	name        string              // portal, for logs and PathStats
	liveness    connectedExecutor   // nil: always considered connected
	rec         recoverableExecutor // nil: no keepalive or reinstatement
	outstanding atomic.Int64
	commands    atomic.Uint64
	lastActive  atomic.Int64 // unix ns of the last completion (or of the first command after idle)

	downs, restores, replayedTotal atomic.Uint64
	aborts, lunResets              atomic.Uint64
	pending                        atomic.Int64 // commands failed by the current outage, to replay
	escalation                     atomic.Int32 // next command-timeout step (recovery.go); 0 after progress
	aluaClass                      atomic.Int32 // preference rank from ALUA (alua.go); 0 best
	aluaState                      atomic.Int32 // scsi.ALUAState, -1 unknown
	tpg                            atomic.Int32 // target port group of the path's port, -1 unknown
}

func (p *path) touch() { p.lastActive.Store(time.Now().UnixNano()) }

func (p *path) idle() time.Duration {
	return time.Duration(time.Now().UnixNano() - p.lastActive.Load())
}

// connectedExecutor is implemented by an Executor that knows whether its connection is up (a
// session.Session). The Device steers commands away from paths that are down, so a dead session,
// which fails commands instantly and so always looks least loaded, does not attract all of them.
type connectedExecutor interface {
	Connected() bool
}

func (p *path) up() bool { return p.liveness == nil || p.liveness.Connected() }

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

// pick returns the connected path with the fewest outstanding commands, preferring one other
// than skip; when none is connected, nil if a path is recovering (the caller waits for it),
// else any path (its command then fails with the connection's error).
func (d *Device) pick(skip *path) *path {
	if len(d.paths) == 1 {
		if p := d.paths[0]; p.up() || !d.recovering {
			return p
		}
		return nil
	}
	start := int(d.rr.Add(1)) % len(d.paths)
	var best *path
	var bestN int64
	var bestC int32
	for i := range d.paths {
		p := d.paths[(start+i)%len(d.paths)]
		if p == skip || !p.up() {
			continue
		}
		// ALUA rank first (optimized before non-optimized before standby), then load.
		c, n := p.aluaClass.Load(), p.outstanding.Load()
		if best == nil || c < bestC || (c == bestC && n < bestN) {
			best, bestN, bestC = p, n, c
			if n == 0 && c == 0 {
				break
			}
		}
	}
	if best == nil && skip != nil && skip.up() {
		best = skip // it came back already
	}
	if best == nil && !d.recovering {
		best = d.paths[start]
	}
	return best
}

// run executes r's command with the retry policy on the least loaded path. When the command
// fails because its path went down (not with a SCSI status), it is re-issued: with recoverable
// paths, on the first path that is up (waiting up to the replacement timeout for one, see
// recovery.go); otherwise once on each other connected path. READ and WRITE are idempotent, and
// the block contract forbids failing a request that another session could serve.
func (d *Device) run(ctx context.Context, r *request) error {
	if d.recovering {
		return d.runRecovering(ctx, r)
	}
	var failed *path
	for attempt := 0; ; attempt++ {
		p := d.pick(failed)
		p.outstanding.Add(1)
		err := d.retry.Execute(ctx, p.ex, &r.cmd, &r.resp)
		p.outstanding.Add(-1)
		p.commands.Add(1)
		if err == nil || attempt+1 >= len(d.paths) || !pathFailure(err, p) || ctx.Err() != nil {
			return err
		}
		failed = p
		if next := d.pick(failed); next == failed || !next.up() {
			return err
		}
		d.log.Warn("path failed; re-issuing on another session", zap.String("command", r.cmd.Name()), zap.Error(err))
	}
}

// runRecovering is run over recoverable paths: a command failed by a connection loss waits for a
// path (this one reinstated, or another) and is re-issued, at most maxReplays times.
func (d *Device) runRecovering(ctx context.Context, r *request) error {
	var failed *path
	seq := d.seq.Add(1)
	queued := false // seq is in d.replays
	defer func() {
		if queued {
			d.replays.remove(seq)
		}
	}()
	for replays := 0; ; {
		// Replays go oldest first, one at a time; new commands wait behind them (replay.go).
		if queued {
			if err := d.replays.waitTurn(ctx, d.bgDone(), seq); err != nil {
				return err
			}
		} else if d.replays.n.Load() > 0 {
			if err := d.replays.waitEmpty(ctx, d.bgDone()); err != nil {
				return err
			}
		}
		p := d.pick(failed)
		if p == nil {
			if err := d.waitPath(ctx); err != nil {
				if failed != nil {
					failed.pending.Add(-1) // it will not be replayed after all
				}
				return err
			}
			continue
		}
		if p.outstanding.Add(1) == 1 {
			p.touch() // the command watchdog measures from the first command after idle
		}
		err := d.retry.Execute(ctx, p.ex, &r.cmd, &r.resp)
		p.outstanding.Add(-1)
		p.commands.Add(1)
		if failed != nil {
			failed.pending.Add(-1) // replayed (or failed again, counted again below)
			failed = nil
		}
		aborted := errors.Is(err, session.ErrTaskAborted) // the command watchdog ended it
		if !aborted && p.escalation.Load() != 0 {
			p.escalation.Store(0) // progress: the next stuck episode starts with ABORT TASK again
		}
		if err == nil || ctx.Err() != nil || (!aborted && !pathFailure(err, p)) {
			p.touch()
			return err
		}
		if replays++; replays > maxReplays || d.closed.Load() {
			return err
		}
		if !queued {
			d.replays.add(seq)
			queued = true
		}
		p.pending.Add(1)
		p.replayedTotal.Add(1)
		d.log.Debug("connection lost; command will be re-issued", zap.String("portal", p.name),
			zap.String("command", r.cmd.Name()), zap.Int("replay", replays), zap.Error(err))
		failed = p
	}
}

// pathFailure reports an error of the path itself (its connection is now down), as opposed to
// a completed command's SCSI status or the caller's context.
func pathFailure(err error, p *path) bool {
	// A connection error is one whatever its cause says (a keepalive's deadline, a timeout).
	var ce *session.ConnError
	if errors.As(err, &ce) {
		return true
	}
	var se *scsi.SenseError
	var st *scsi.StatusError
	if errors.As(err, &se) || errors.As(err, &st) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	return !p.up()
}

// check is the entry check of every request: open, in range, aligned.
func (d *Device) check(off, length int64) error {
	if d.closed.Load() {
		return block.ErrClosed
	}
	return block.CheckRange(d, off, length)
}

func (d *Device) checkWrite(off, length int64) error {
	if err := d.check(off, length); err != nil {
		return err
	}
	if d.limits.ReadOnly {
		return fmt.Errorf("iser: %s: %w", d.info.URL, block.ErrReadOnly)
	}
	return nil
}

// opError wraps a failure of op on [off, +n) so that it names the request and satisfies exactly
// one block sentinel: SCSI errors and sentinel-carrying errors keep theirs, context errors stay
// context errors, anything else (a transport failure) becomes ErrIO.
func opError(op string, off, n int64, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || hasSentinel(err) {
		return fmt.Errorf("iser: %s [%d, +%d): %w", op, off, n, err)
	}
	return fmt.Errorf("iser: %s [%d, +%d): %w: %w", op, off, n, block.ErrIO, err)
}

var sentinels = []error{block.ErrIO, block.ErrInvalid, block.ErrReadOnly, block.ErrNoSpace,
	block.ErrNotSupported, block.ErrMedium, block.ErrTimeout, block.ErrClosed, block.ErrNoPath}

func hasSentinel(err error) bool {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

func isInvalidOpcode(err error) bool {
	var se *scsi.SenseError
	return errors.As(err, &se) && se.Key == scsi.KeyIllegalRequest && se.Code() == scsi.ASCInvalidOpcode
}

func isInvalidField(err error) bool {
	var se *scsi.SenseError
	return errors.As(err, &se) && se.Key == scsi.KeyIllegalRequest && se.Code() == scsi.ASCInvalidFieldInCDB
}

// fanout runs piece(0..n-1) with at most maxFanout in flight and returns the first error. The
// caller's goroutine works too, so a two-piece request starts one goroutine.
func fanout(n int, piece func(i int) error) error {
	if n == 1 {
		return piece(0)
	}
	var (
		next    atomic.Int64
		mu      sync.Mutex
		first   error
		wg      sync.WaitGroup
		workers = min(n, maxFanout)
	)
	work := func() {
		for {
			i := int(next.Add(1) - 1)
			if i >= n {
				return
			}
			if err := piece(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}
	}
	wg.Add(workers - 1)
	for range workers - 1 {
		go func() { defer wg.Done(); work() }()
	}
	work()
	wg.Wait()
	return first
}

// ReadAt implements block.Device.
func (d *Device) ReadAt(ctx context.Context, p []byte, off int64) error {
	if err := d.check(off, int64(len(p))); err != nil {
		return err
	}
	return d.transfer(ctx, p, off, false, false)
}

// WriteAt implements block.Device. Without native FUA (MODE SENSE DPOFUA clear) a FUA write is a
// WRITE followed by SYNCHRONIZE CACHE of its range.
func (d *Device) WriteAt(ctx context.Context, p []byte, off int64, flags block.WriteFlags) error {
	if err := d.checkWrite(off, int64(len(p))); err != nil {
		return err
	}
	fua := flags&block.FUA != 0
	if !fua || d.limits.CanFUA {
		return d.transfer(ctx, p, off, true, fua)
	}
	if err := d.transfer(ctx, p, off, true, false); err != nil {
		return err
	}
	return d.syncRange(ctx, off, int64(len(p)))
}

// transfer reads or writes p at off, splitting at the per-command limit.
func (d *Device) transfer(ctx context.Context, p []byte, off int64, write, fua bool) error {
	if len(p) == 0 {
		return nil
	}
	maxBytes := int64(d.maxXferBlocks) << d.shift
	if int64(len(p)) <= maxBytes {
		return d.transferOne(ctx, p, off, write, fua)
	}
	n := int((int64(len(p)) + maxBytes - 1) / maxBytes)
	return fanout(n, func(i int) error {
		lo := int64(i) * maxBytes
		hi := min(lo+maxBytes, int64(len(p)))
		return d.transferOne(ctx, p[lo:hi], off+lo, write, fua)
	})
}

// buildRW fills cmd with the READ or WRITE of p at byte offset off: the 16-byte CDBs when the
// LUN needs (or was probed to take) them, the 10-byte ones otherwise.
func (d *Device) buildRW(cmd *scsi.Command, p []byte, off int64, write, fua bool) {
	lba := uint64(off) >> d.shift
	blocks := uint64(len(p)) >> d.shift
	switch {
	case write && d.use16:
		cmd.Write16(lba, uint32(blocks), fua, p)
	case write:
		cmd.Write10(uint32(lba), uint16(blocks), fua, p)
	case d.use16:
		cmd.Read16(lba, uint32(blocks), false, p)
	default:
		cmd.Read10(uint32(lba), uint16(blocks), false, p)
	}
}

func (d *Device) transferOne(ctx context.Context, p []byte, off int64, write, fua bool) error {
	r := d.get()
	defer d.put(r)
	d.buildRW(&r.cmd, p, off, write, fua)
	if err := d.run(ctx, r); err != nil {
		if write {
			return opError("write", off, int64(len(p)), err)
		}
		return opError("read", off, int64(len(p)), err)
	}
	if r.resp.Residual != 0 {
		// A GOOD status that moved fewer (or more) bytes than asked is a lying or broken target;
		// a short read must never look like success.
		op := "read"
		if write {
			op = "write"
		}
		return fmt.Errorf("iser: %s [%d, +%d): target reported residual %d: %w", op, off, len(p), r.resp.Residual, block.ErrIO)
	}
	return nil
}

// Flush implements block.Device: SYNCHRONIZE CACHE of the whole LUN on one session, which covers
// writes completed on every session (the cache belongs to the logical unit).
func (d *Device) Flush(ctx context.Context) error {
	if d.closed.Load() {
		return block.ErrClosed
	}
	return d.syncCache(ctx, 0, 0)
}

// syncRange makes [off, +n) durable when the LUN has a volatile cache.
func (d *Device) syncRange(ctx context.Context, off, n int64) error {
	if !d.volatile || n == 0 {
		return nil
	}
	lba := uint64(off) >> d.shift
	blocks := uint64(n) >> d.shift
	if blocks > 0xFFFFFFFF {
		blocks = 0 // to the end of the medium
	}
	return d.syncCache(ctx, lba, blocks)
}

func (d *Device) syncCache(ctx context.Context, lba, blocks uint64) error {
	r := d.get()
	defer d.put(r)
	for {
		use10 := d.sync10.Load() || !d.use16
		if use10 {
			b10 := blocks
			if lba > 0xFFFFFFFF {
				// SYNCHRONIZE CACHE(10) cannot address it: flush everything.
				lba, b10 = 0, 0
			} else if b10 > 0xFFFF {
				b10 = 0
			}
			r.cmd.SynchronizeCache10(uint32(lba), uint16(b10))
		} else {
			r.cmd.SynchronizeCache16(lba, uint32(blocks))
		}
		err := d.run(ctx, r)
		if err != nil && !use10 && isInvalidOpcode(err) {
			d.sync10.Store(true)
			continue
		}
		return opError("flush", int64(lba)<<d.shift, int64(blocks)<<d.shift, err)
	}
}

// Discard implements block.Device with UNMAP (LBPU) or WRITE SAME(16) with UNMAP (LBPWS).
func (d *Device) Discard(ctx context.Context, off, length int64) error {
	if err := d.checkWrite(off, length); err != nil {
		return err
	}
	if !d.limits.CanDiscard {
		return fmt.Errorf("iser: discard: the LUN supports neither UNMAP nor WRITE SAME with UNMAP: %w", block.ErrNotSupported)
	}
	if length == 0 {
		return nil
	}
	lba, blocks := uint64(off)>>d.shift, uint64(length)>>d.shift
	n := int((blocks + d.maxUnmapBlocks - 1) / d.maxUnmapBlocks)
	return fanout(n, func(i int) error {
		plba := lba + uint64(i)*d.maxUnmapBlocks
		pn := min(d.maxUnmapBlocks, lba+blocks-plba)
		r := d.get()
		defer d.put(r)
		if d.lbpu {
			r.cmd.Unmap(scsi.EncodeUnmap(r.param[:], []scsi.UnmapDescriptor{{LBA: plba, Blocks: uint32(pn)}}))
		} else {
			r.cmd.WriteSame16(plba, uint32(pn), true, false, d.zeroBlock())
		}
		return opError("discard", int64(plba)<<d.shift, int64(pn)<<d.shift, d.run(ctx, r))
	})
}

// zeroBlock returns a shared, never-written buffer of zeroes of at least one block (it is
// also the write-zeroes emulation's source).
func (d *Device) zeroBlock() []byte { return d.zeroes()[:d.bs] }

func (d *Device) zeroes() []byte {
	d.zeroOnce.Do(func() {
		n := min(int64(d.maxXferBlocks)<<d.shift, zeroBufMax)
		n = max(n, d.bs)
		d.zeroBuf = make([]byte, n)
	})
	return d.zeroBuf
}

// WriteZeroes implements block.Device: WRITE SAME(16) (with UNMAP when the LUN deallocates to
// zeroes and the caller allows holes; with NDOB when the LUN honours it), else writes of zeroes
// unless the caller asked for FastOnly.
func (d *Device) WriteZeroes(ctx context.Context, off, length int64, flags block.ZeroFlags) error {
	if err := d.checkWrite(off, length); err != nil {
		return err
	}
	if length == 0 {
		return nil
	}
	if d.ws.Load() != wsNo {
		err := d.writeSame(ctx, off, length, flags)
		if !errors.Is(err, errWriteSameUnsupported) {
			return err
		}
	}
	if flags&block.FastOnly != 0 {
		return fmt.Errorf("iser: write zeroes: the LUN has no WRITE SAME and FastOnly was asked: %w", block.ErrNotSupported)
	}
	buf := d.zeroes()
	step := int64(len(buf))
	n := int((length + step - 1) / step)
	fua := flags&block.ZeroFUA != 0
	err := fanout(n, func(i int) error {
		lo := int64(i) * step
		return d.transfer(ctx, buf[:min(step, length-lo)], off+lo, true, fua && d.limits.CanFUA)
	})
	if err != nil || !fua || d.limits.CanFUA {
		return err
	}
	return d.syncRange(ctx, off, length)
}

var errWriteSameUnsupported = errors.New("WRITE SAME unsupported")

func (d *Device) writeSame(ctx context.Context, off, length int64, flags block.ZeroFlags) error {
	unmap := flags&block.NoHole == 0 && d.lbpws && d.lbprz
	lba, blocks := uint64(off)>>d.shift, uint64(length)>>d.shift
	piece := func(i int) error {
		plba := lba + uint64(i)*d.maxWSBlocks
		pn := min(d.maxWSBlocks, lba+blocks-plba)
		r := d.get()
		defer d.put(r)
		for {
			ndob := d.ndob.Load()
			r.cmd.WriteSame16(plba, uint32(pn), unmap, ndob, d.zeroBlock())
			err := d.run(ctx, r)
			switch {
			case err == nil:
				d.ws.CompareAndSwap(wsUnknown, wsYes)
				return nil
			case ndob && isInvalidField(err):
				d.ndob.Store(false) // the target does not honour NDOB after all
				continue
			case isInvalidOpcode(err) && d.ws.Load() != wsYes:
				d.ws.Store(wsNo)
				return errWriteSameUnsupported
			case isInvalidField(err):
				// The target refuses this form of WRITE SAME (LIO answers "invalid field in
				// CDB" for a backstore that cannot do it, even when REPORT SUPPORTED OPERATION
				// CODES lists it): the caller writes zeroes instead, and WRITE SAME is not
				// tried again on this device. Requests are already split at the LUN's
				// MAXIMUM WRITE SAME LENGTH, so a length refusal is not expected.
				d.ws.Store(wsNo)
				return errWriteSameUnsupported
			}
			return opError("write zeroes", int64(plba)<<d.shift, int64(pn)<<d.shift, err)
		}
	}
	n := int((blocks + d.maxWSBlocks - 1) / d.maxWSBlocks)
	start := 0
	if d.ws.Load() == wsUnknown {
		// Learn whether WRITE SAME works on one piece before sending the rest.
		if err := piece(0); err != nil {
			return err
		}
		start = 1
	}
	if start < n {
		if err := fanout(n-start, func(i int) error { return piece(i + start) }); err != nil {
			return err
		}
	}
	if flags&block.ZeroFUA != 0 {
		// WRITE SAME has no FUA bit.
		return d.syncRange(ctx, off, length)
	}
	return nil
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
