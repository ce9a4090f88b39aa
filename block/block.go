// Package block is the one contract every layer of iser-blk speaks.
//
// A frontend (NBD, ublk) turns client requests into calls on a Device; the cache is a Device that
// wraps a Device; the backend is a Device over iSCSI sessions. Nothing above a Device knows what is
// below it, and nothing below knows who is above.
//
// Invariants every implementation keeps:
//   - Offsets and lengths are in bytes and are multiples of BlockSize(); a request outside
//     [0, Size()) fails with ErrInvalid (wrapped) before anything is sent anywhere.
//   - Every method is safe for concurrent use; concurrency comes from many goroutines calling it.
//   - A Device never keeps a caller's buffer after the call returns. A layer that needs the bytes
//     later (the write-back cache) copies them. Buffers normally come from the pool package so that
//     an RDMA transport can hand them to the device without a copy, but any []byte is accepted.
//   - A write is acknowledged (returns nil) only when it is at least in a volatile cache that a
//     later Flush makes durable; with FUA it is durable when the call returns.
//   - Errors are never swallowed: every failure returns an error that errors.Is one of the
//     sentinels below, so each frontend can map it to its own wire code (see Errno).
//   - Context: a request's ctx bounds how long the Device may wait on its behalf. A Device may
//     complete a request whose context is already done (a cache hit never looks at it); when it
//     gives up because of the context, the error satisfies ErrCanceled (context.Canceled) or
//     ErrTimeout (context.DeadlineExceeded), and still the context error itself (ContextError).
//   - Close: the first Close releases the device and reports what failed doing so; every later
//     Close, concurrent or not, returns nil once the device is released (it is idempotent:
//     shutdown paths close a stack from a signal handler and from deferred cleanup, and the second
//     call has nothing to report). Every other method after Close fails with ErrClosed.
//
// Package blocktest is the conformance suite that checks these rules on any Device.
package block

import "context"

// WriteFlags modify WriteAt.
type WriteFlags uint32

const (
	// FUA (force unit access): the data is on stable storage when WriteAt returns.
	FUA WriteFlags = 1 << iota
)

// ZeroFlags modify WriteZeroes.
type ZeroFlags uint32

const (
	// NoHole asks that the range stay allocated: zeroes are written, not unmapped
	// (NBD_CMD_FLAG_NO_HOLE; WRITE SAME without the UNMAP bit).
	NoHole ZeroFlags = 1 << iota
	// FastOnly asks to fail with ErrNotSupported unless zeroing is faster than writing zeroes
	// (NBD_CMD_FLAG_FAST_ZERO).
	FastOnly
	// ZeroFUA makes the zeroes durable before the call returns.
	ZeroFUA
)

// Limits describes what a Device can do and how large its requests may be. Capabilities are
// negotiated, never assumed: a frontend advertises exactly what Limits says, and a wrapping layer
// derives its own Limits from the layer below.
type Limits struct {
	LogicalBlockSize  uint32 // bytes; every offset and length is a multiple of it
	PhysicalBlockSize uint32 // bytes; preferred alignment (>= LogicalBlockSize)
	MaxTransfer       int64  // largest ReadAt/WriteAt in bytes (0: no limit)
	OptimalTransfer   int64  // preferred request size in bytes (0: unknown)
	MaxDiscard        int64  // largest Discard in bytes (0: no limit)
	MaxWriteZeroes    int64  // largest WriteZeroes in bytes (0: no limit)
	DiscardAlignment  int64  // discard granularity in bytes (0: LogicalBlockSize)

	ReadOnly       bool // writes, discards and zeroing fail with ErrReadOnly
	VolatileCache  bool // acknowledged writes may be lost until Flush returns
	CanFlush       bool // Flush does something (false: it is a no-op that returns nil)
	CanFUA         bool // the FUA flag is honoured natively (else the layer emulates it with Flush)
	CanDiscard     bool // Discard is supported
	CanWriteZeroes bool // WriteZeroes is supported (possibly emulated by writing zeroes)
	CanFastZero    bool // WriteZeroes with FastOnly can succeed
	DiscardZeroes  bool // a discarded range reads back as zeroes (SCSI LBPRZ)
	Rotational     bool
	MultiConn      bool // every connection sees the same data and a Flush on one covers all (NBD CAN_MULTI_CONN)
}

// Device is a block device: the contract between frontends, the cache and backends.
// See the package comment for the invariants.
type Device interface {
	// Size is the capacity in bytes.
	Size() int64
	// BlockSize is the logical block size in bytes.
	BlockSize() int
	// Limits reports capabilities and request size limits. It does not change while the
	// Device is open.
	Limits() Limits
	// ReadAt fills p with the bytes at off. It returns nil only when all of p was read.
	ReadAt(ctx context.Context, p []byte, off int64) error
	// WriteAt writes p at off. p is not retained after the call returns.
	WriteAt(ctx context.Context, p []byte, off int64, flags WriteFlags) error
	// Flush returns when every write acknowledged before the call is on stable storage.
	Flush(ctx context.Context) error
	// Discard tells the device that the range is no longer needed (TRIM / UNMAP).
	Discard(ctx context.Context, off, length int64) error
	// WriteZeroes makes the range read back as zeroes.
	WriteZeroes(ctx context.Context, off, length int64, flags ZeroFlags) error
	// Close releases the device. Callers drain their own in-flight requests first; Close on a
	// layer that holds dirty data flushes it (or returns the error that prevented it). A second
	// Close returns nil; any other call after Close fails with ErrClosed.
	Close() error
}

// CachedReader is an optional interface of a Device that holds data in memory (a cache). ReadCached
// copies [off, off+len(p)) into p and returns true only when all of it was in memory; it never
// waits for I/O, so a frontend may call it on the goroutine that reads requests and answer at once.
// On false the contents of p are unspecified and the caller uses ReadAt. Out-of-range or
// misaligned requests return false (ReadAt then reports the error).
type CachedReader interface {
	ReadCached(p []byte, off int64) bool
}

// CachedWriter is the write-side counterpart of CachedReader: WriteCached stores p at off in the
// device's memory and returns true when the write is complete with the same guarantees as a
// WriteAt without flags that returned nil (a later Flush covers it). It never waits (for I/O, for
// dirty room, for a free page), so a frontend may call it on the goroutine that reads requests. On
// false nothing is acknowledged: part of p may already be stored, and the caller must send the
// whole write through WriteAt (storing the same bytes again is harmless). Out-of-range or
// misaligned requests, and writes the device must send through to its backend (write-through),
// return false.
type CachedWriter interface {
	WriteCached(p []byte, off int64) bool
}

// Completion receives the result of a request started with Submitter.SubmitAt.
type Completion interface {
	// Complete is called exactly once per started request, with what ReadAt or WriteAt would
	// have returned. It runs on a goroutine of the device (possibly before SubmitAt returned) and
	// must not block.
	Complete(err error)
}

// BatchCompletion is an optional interface of a Completion whose result is acted on elsewhere (an
// NBD reply sent by the connection's writer) and can wait until the device has delivered every
// completion it has at hand: one wake-up of that writer and one vectored write then answer the
// whole run instead of one per request. A device that completes requests in runs on one
// goroutine (the iSCSI session's reader, between two reads of its socket) calls CompleteBatched
// instead of Complete, and Flush once on every distinct Flusher it got back, on the same
// goroutine, before it next waits for input. CompleteBatched must not block either.
type BatchCompletion interface {
	Completion
	// CompleteBatched is Complete except that the work it starts may wait for the returned
	// Flusher's Flush (nil: nothing waits).
	CompleteBatched(err error) Flusher
}

// Flusher starts the work that CompleteBatched left waiting (see BatchCompletion).
type Flusher interface {
	Flush()
}

// CompleteBatched delivers err to done: through CompleteBatched if done is a BatchCompletion
// (the caller must then Flush what it returns, see BatchCompletion), else through Complete.
func CompleteBatched(done Completion, err error) Flusher {
	if bc, ok := done.(BatchCompletion); ok {
		return bc.CompleteBatched(err)
	}
	done.Complete(err)
	return nil
}

// Submitter is an optional interface of a Device that can start a read or a write without
// blocking the caller and report its end to a Completion, so that a frontend serving many
// requests from one goroutine needs no goroutine per request in flight. SubmitAt starts a read of
// len(p) bytes at off into p (write false) or a write of p at off with flags, and returns true,
// or returns false without starting anything when it would have to wait (no free command slot,
// a closed command window, a request the device cannot issue as one command) or cannot take this
// path at all: the caller then uses ReadAt or WriteAt. ctx bounds only what the device may do on
// the request's behalf after a failed first attempt (retries, re-issue on another path). p must
// stay untouched until Complete. A device may hold started requests back to send them together:
// Kick sends them, and a caller must call it before it blocks (waits for more work).
type Submitter interface {
	SubmitAt(ctx context.Context, p []byte, off int64, write bool, flags WriteFlags, done Completion) bool
	Kick()
}

// SubmitWriteLimiter is an optional interface of a Submitter: SubmitWriteMax is the largest
// write SubmitAt may take right now (0: none); it declines larger ones. A layer that prepares a
// write before it submits it (the cache supersedes its pages of the range) asks first, rather
// than prepare, be declined and prepare again on the synchronous path. The answer may change
// (a new login negotiates other limits): it is a hint, and SubmitAt still decides.
type SubmitWriteLimiter interface {
	SubmitWriteMax() int
}

// Pipe is the two ends of a non-blocking pipe(2) (file descriptors), for PipeSubmitter.
type Pipe struct {
	R, W int
}

// PipeSubmitter is an optional interface of a Device that can deliver a read's data into a pipe
// without copying it through user memory (the iSCSI backend over TCP splices it from the socket
// with splice(2)), so that a frontend can splice it on into its client's socket: the bytes cross
// the process without being copied. It is Submitter's read for callers that own a pipe.
//
// SubmitReadToPipe starts a read of n bytes at off whose data goes into pipe, and returns true,
// or returns false having started nothing (the caller then uses SubmitAt or ReadAt), on the same
// grounds as SubmitAt and whenever the device cannot splice this request. The caller guarantees
// that the pipe is empty, has room for n bytes (F_SETPIPE_SZ), and is neither read nor written by
// anyone else until done is called. Complete(nil) means the pipe holds exactly the n bytes of the
// range, in order; after Complete(err) the pipe holds an unspecified part of them and the caller
// drains or discards it. Kick applies as for SubmitAt (the device must also be a Submitter).
//
// A layer that must see reads offers it only for the ranges where the device below holds the
// newest data (the cache: a read around its pages over a range with no dirty page), and declines
// the rest; a layer that does not implement it hides the interface of the device below.
type PipeSubmitter interface {
	SubmitReadToPipe(ctx context.Context, pipe Pipe, n int, off int64, done Completion) bool
}

// CheckRange validates a request against a device's size and block size, returning an error that
// wraps ErrInvalid when it is misaligned or out of range. Every layer calls it at its entry.
func CheckRange(d Device, off, length int64) error {
	bs := int64(d.BlockSize())
	size := d.Size()
	switch {
	case off < 0 || length < 0:
		return &RangeError{Off: off, Len: length, Size: size, Reason: "negative"}
	case bs > 0 && (off%bs != 0 || length%bs != 0):
		return &RangeError{Off: off, Len: length, Size: size, Reason: "not aligned to the block size"}
	case off > size || length > size-off:
		return &RangeError{Off: off, Len: length, Size: size, Reason: "past the end of the device"}
	}
	return nil
}

// DirtyReporter is an optional interface of a Device that holds acknowledged writes the device
// below does not have yet (a write-back cache): DirtyBytes is how many bytes that is now. The
// lifecycle asks it whether a flush left anything unwritten and how a write-back progresses.
type DirtyReporter interface {
	DirtyBytes() int64
}

// Layered is an optional interface of a Device that sits on another one (a cache on its
// backend): Below is that device, so that status and metrics can reach the backend's own
// optional interfaces (paths, LUN) through the layers above it.
type Layered interface {
	Below() Device
}

// Abandoner is an optional interface of a Device that may hold dirty data: Abandon releases it
// without trying to write anything back, for a shutdown whose final flush failed or was aborted
// (a Close would try, and wait for, the write-back again).
type Abandoner interface {
	Abandon() error
}

// Persister is an optional interface of a Device that keeps acknowledged writes durably on local
// storage of its own (a persistent write-back log: cache/journal), so that its Flush makes data
// durable there and not on the device below. DirtyBytes is what the device below does not have
// yet. Drain writes all of it to the device below (a detach, a stop); Keep makes the next Close
// leave it where it is, durable, for a successor that opens the same storage (a planned restart,
// a stop that keeps the device), where Close would otherwise drain.
type Persister interface {
	DirtyReporter
	Drain(ctx context.Context) error
	Keep()
}
