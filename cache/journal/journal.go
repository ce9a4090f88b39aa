package journal

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
)

// Options configures a Journal. The zero value of every field means its default.
type Options struct {
	// Format formats a cache device that holds something else, or another LUN's cache, instead
	// of refusing it (--cache-dev-format). Whatever it held is lost.
	Format bool
	// WriteAround is the size from which a write goes straight to the target instead of through
	// the log, as the RAM cache's (cache.Config.WriteAround); default 256 KiB.
	WriteAround int64
	// Workers is the number of write-backs to the target in flight; default 8.
	Workers int
	// RoundBytes bounds the log space one write-back round covers before it records its
	// checkpoint; default 64 MiB.
	RoundBytes int64
	// CleanAfter is how long data stays in the log before write-back starts without another
	// reason (the log a quarter full, a detach); default 10 s, the RAM cache's age limit: rewrites
	// of hot blocks in between are written back once.
	CleanAfter time.Duration
	// Log receives the journal's messages; default none.
	Log *zap.Logger
	// Path names the cache device in status (OpenPath sets it).
	Path string
}

// Defaults.
const (
	DefaultWriteAround = 256 << 10
	DefaultWorkers     = 8
	DefaultRoundBytes  = 64 << 20
	DefaultCleanAfter  = 10 * time.Second
	// MinSize is the smallest cache device: a ring that holds a few rounds of small writes.
	MinSize = 16 << 20
	// maxBatchData bounds the data of one batch (one write system call).
	maxBatchData = 4 << 20
)

// Journal is a block.Device that keeps written data in a log on a local cache device and writes
// it back to the target later. See the package comment.
type Journal struct {
	be    block.Device
	m     Media
	log   *zap.Logger
	opt   Options
	lim   block.Limits // what the journal offers
	beLim block.Limits // the target's
	bs    int64        // the LUN's block size
	u     int64        // bytes of a ring unit (unitFor)
	hdrU  uint64       // units of a batch header
	n     uint64       // units in the ring
	inst  [16]byte

	// rmu is held shared by readers of ring units from the lookup until their read completed,
	// and exclusively by the reclaim that frees units for reuse. Order: rmu → mu.
	rmu sync.RWMutex
	// mu guards the index, the ring positions, the in-flight write-back runs and failed.
	mu       sync.Mutex
	idx      *index
	head     uint64 // ring position after the last complete batch
	tail     uint64 // ring position of the oldest batch not written back (the checkpoint)
	tailSeq  uint64
	seq      uint64 // the next batch's sequence number
	prevSeq  uint64 // the last batch's
	cleaning []lbaRange
	claims   []claim // merges and direct operations in flight (claims.go)
	// dirtySince is when the log last went from empty to holding data (zero: empty): the
	// cleaner starts once that is CleanAfter ago.
	dirtySince time.Time
	failed     error // the cache device failed: every write and flush fails from now on
	changed    notifier

	// amu guards the queue of appends waiting for the batch writer.
	amu     sync.Mutex
	pending []*appendReq
	spare   []*appendReq
	writing bool
	// The batch writer's (one at a time: the append that found writing unset).
	hdr      Header
	hdrBuf   []byte
	wrapBuf  []byte
	mergeBuf []byte        // a unit, for appendMerge
	tryReq   appendReq     // tryAppend's entry
	tryReqs  [1]*appendReq // tryAppend's batch
	zeroes   []byte        // a unit of zeroes (read-only)
	iov      [][]byte

	appended atomic.Uint64 // batches written
	directs  atomic.Uint64 // operations sent to the target around the log
	syncMu   sync.Mutex    // serialises fdatasync and the target's flush (group commit)
	synced   uint64        // batches durable (under syncMu)
	dflushed uint64        // directs covered by a target flush (under syncMu)

	super    Super      // the last superblock written (Open's, then the cleaning rounds')
	cleanMu  sync.Mutex // serialises cleaning rounds; guards refs and cleanHdr
	refs     []blockRef
	cleanHdr []byte
	kick     chan struct{}
	drain    chan struct{}
	stop     chan struct{}
	wg       sync.WaitGroup
	st       stats
	closeMu  sync.Mutex
	closed   atomic.Bool
	keep     atomic.Bool  // Close leaves the log (Keep)
	ops      atomic.Int64 // calls in progress
}

type lbaRange struct{ lo, hi uint64 }

func (r lbaRange) overlaps(lo, hi uint64) bool { return r.lo < hi && lo < r.hi }

// notifier wakes everybody waiting for a change (mu held to read the state they wait on).
type notifier struct {
	mu sync.Mutex
	ch chan struct{}
}

func (n *notifier) wait() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	return n.ch
}

func (n *notifier) broadcast() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch != nil {
		close(n.ch)
		n.ch = nil
	}
}

// ErrFailed is wrapped by every error after the cache device failed a write or a sync: from then
// on the page cache's state of the log is unknown (fsyncgate), so the journal takes no more writes
// and fails every flush until the gateway is restarted and recovery reads the device again.
var _ block.Persister = (*Journal)(nil)

var ErrFailed = errors.New("journal: the cache device failed")

// Size, BlockSize: the target's.
func (j *Journal) Size() int64    { return j.be.Size() }
func (j *Journal) BlockSize() int { return int(j.bs) }

// Limits are the target's, with a volatile cache that flushes and honours FUA: the log is that
// cache, and a Flush makes it durable on the cache device.
func (j *Journal) Limits() block.Limits { return j.lim }

// Below implements block.Layered.
func (j *Journal) Below() block.Device { return j.be }

func (j *Journal) enter() error {
	j.ops.Add(1)
	if j.closed.Load() {
		j.exit()
		return fmt.Errorf("journal: %w", block.ErrClosed)
	}
	return nil
}

func (j *Journal) exit() {
	if j.ops.Add(-1) == 0 && j.closed.Load() {
		j.changed.broadcast()
	}
}

func (j *Journal) failure() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.failed
}

// fail records that the cache device failed. The first failure is kept and logged.
func (j *Journal) fail(err error) error {
	j.mu.Lock()
	if j.failed == nil {
		j.failed = fmt.Errorf("%w: %w", ErrFailed, err)
		j.log.Error("the cache device failed; writes and flushes fail until the gateway restarts", zap.Error(err))
	}
	err = j.failed
	j.mu.Unlock()
	j.changed.broadcast()
	return &ioError{err}
}

// ioError satisfies block.ErrIO and unwraps to its cause.
type ioError struct{ cause error }

func (e *ioError) Error() string        { return e.cause.Error() }
func (e *ioError) Is(target error) bool { return target == block.ErrIO }
func (e *ioError) Unwrap() error        { return e.cause }

// Close writes everything in the log back to the target (the detach), records the empty log,
// and closes the cache device and the target; after Keep it leaves the log as it is, durable. Data
// that could not be written back stays on the cache device for the next attach, and Close reports
// it.
func (j *Journal) Close() error { return j.CloseContext(context.Background()) }

// CloseContext is Close with a deadline for the write-back.
func (j *Journal) CloseContext(ctx context.Context) error {
	j.closeMu.Lock()
	defer j.closeMu.Unlock()
	if j.closed.Load() {
		return nil
	}
	if j.keep.Load() {
		return j.closeKeeping()
	}
	err := j.drainAll(ctx)
	j.shutdown()
	if err != nil {
		j.log.Error("write-back at close failed; the data stays on the cache device for the next attach",
			zap.Error(err), zap.String("left", humanize.IBytes(j.Stats().DirtyBytes)))
	}
	return errors.Join(err, j.m.Close(), j.be.Close())
}

// Drain writes everything in the log back to the target and records the empty log
// (block.Persister), retrying failed write-backs until ctx is done.
func (j *Journal) Drain(ctx context.Context) error {
	if err := j.enter(); err != nil {
		return err
	}
	defer j.exit()
	return j.drainAll(ctx)
}

// Keep makes Close leave the log on the cache device (block.Persister).
func (j *Journal) Keep() { j.keep.Store(true) }

// Abandon closes without writing back (block.Abandoner), as Close after Keep: what the log holds
// stays on the cache device, durable up to the last Flush, and the next attach of this LUN with
// this cache device recovers it.
func (j *Journal) Abandon() error {
	j.closeMu.Lock()
	defer j.closeMu.Unlock()
	if j.closed.Load() {
		return nil
	}
	return j.closeKeeping()
}

func (j *Journal) closeKeeping() error {
	j.shutdown()
	serr := j.m.Sync()
	if serr != nil {
		serr = fmt.Errorf("journal: keeping the log: %w", serr)
	} else if left := j.Stats().DirtyBytes; left > 0 {
		j.log.Info("the log stays on the cache device for the next attach", zap.String("dirty", humanize.IBytes(left)))
	}
	return errors.Join(serr, j.m.Close(), j.be.Close())
}

// shutdown stops the write-back and waits for the calls in progress.
func (j *Journal) shutdown() {
	j.closed.Store(true)
	close(j.stop)
	j.changed.broadcast()
	j.wg.Wait()
	for {
		ch := j.changed.wait()
		if j.ops.Load() == 0 {
			return
		}
		<-ch
	}
}
