// Package cache is iser-blk's write-back / write-through cache: a block.Device that wraps a
// block.Device and behaves exactly like a disk with a volatile write cache.
//
// # Pages and their states
//
// The device is cut into pages of PageSize bytes (4 KiB by default), each made of up to 64
// logical blocks ("sectors"). Page memory comes from a private pool.Pool (mmap, outside the Go
// heap, so a 1 GiB cache costs the garbage collector almost nothing: what stays on the heap is
// about 180 bytes of pointer-free metadata per page, ~45 MiB for 1 GiB of 4 KiB pages). Backend
// I/O goes through staging buffers from Config.IOPool when set (registered memory for iSER): a
// write-back gathers its pages into one buffer, a miss reads into one and is copied into pages
// (a miss of one whole page started on the backend's Submitter reads straight into the caller's
// buffer instead, submit.go).
// A cached page ("slot") carries:
//
//   - valid: the sectors whose bytes in the page are the device's current content. A sector is
//     valid because it was read from the backend, or written through the cache.
//   - dirty: the valid sectors that the backend does not have yet: written and acknowledged, not
//     yet written back. A dirty page is never evicted. The dirty pages are kept in a FIFO ordered
//     by the moment they became dirty (dirtySeq), which is what Flush and the age limit use.
//   - gen: a generation number bumped by every modification of the page's dirty contents (a write,
//     a discard). A write-back records gen when it snapshots the page; when it completes, it clears
//     the dirty bits it wrote only if gen is unchanged. A write that lands on a page while the page
//     is being written back therefore keeps it dirty: the completing write-back never marks newer
//     data clean.
//   - inflight ("write-back in progress"): a backend write carrying this page's data is in flight.
//     At most one is in flight per page, so two write-backs of one page can never reach the backend
//     out of order (an older snapshot landing after a newer one). FUA and write-through writes go
//     through the same write-back path and obey the same rule.
//   - pins: readers filling the page from the backend; a pinned page is not evicted.
//
// Discard and write-zeroes ("direct" operations) go to the backend at once. Before they are sent,
// the range is registered (no write-back of a page in it may start), its clean cached sectors are
// invalidated, the dirty pages it overlaps take zeroes there and stay dirty (dropping their data
// would let a Flush that started earlier succeed before the operation reached the backend, and a
// crash would then bring back data older than that Flush promised), and the operation waits for
// every write-back of the range already in flight. Only then is the backend command issued, so an
// old write-back can never land after the discard and resurrect old data. Reads that filled from
// the backend while a direct operation overlapped do not install what they read.
//
// A FUA write (and every write in write-through mode) is copied into pages and then the dirty
// pages of its range are written back before it returns, waiting for any write-back of them in
// flight. Those backend writes carry FUA (or are followed by a backend Flush when the backend has
// no FUA); if some bytes of the range were carried by another write-back without FUA (the flusher
// got there first), a backend Flush makes them durable before the ack.
//
// A write of Config.WriteAround bytes or more (256 KiB by default), or of a quarter of that
// continuing a sequential stream that has written WriteAround bytes (bcache's sequential cutoff),
// goes around the pages: from the caller's buffer straight to the backend, as a
// direct operation whose data, not zeroes, the dirty pages it overlaps take (writearound.go).
// Once its backend write succeeded, those pages are clean again unless modified since (the
// backend has their data). WriteCached declines such writes.
//
// A read of Config.ReadAround bytes or more (256 KiB by default), and a miss of a quarter of that
// continuing a sequential stream (streams.go), goes from the backend straight into the caller's
// buffer and is not cached. The dirty pages of its range are pinned before the backend read and
// their valid sectors copied over what it returned, so newer data always wins (readaround.go); a
// range with no dirty page (found without a lock: dirty pages are counted per 1 MiB region) is
// started on the backend's own Submitter like a read with the cache off (submitaround.go), and
// ReadCached declines such reads so that a frontend gets there.
//
// A miss within one page, and a write that goes around the pages, may also be started without
// blocking (SubmitAt, block.Submitter) on the backend's own Submitter, so that a frontend's reader
// goroutine starts them without handing them to a worker: the miss's completion fills the page
// exactly as a synchronous miss does. A miss of a whole page into a slot used before is read into
// the caller's buffer and installed from it before the reply; any other replies before it copies
// the data into the page, and for a slot never used before on a goroutine of its own started
// first, so that a reply writer woken by the completion runs before it (the first touch of a page
// costs a page fault); the
// write-around registers and supersedes exactly as
// writeAround does, and declines instead of waiting when a write-back of its range is in flight
// (submit.go).
//
// Reads copy valid sectors from pages; a miss reads the page-aligned span (plus read-ahead for a
// sequential stream) into placeholder pages, filling only sectors that are not valid, so a
// sub-page write never needs a read-modify-write and never loses to a concurrent fill. Eviction is
// CLOCK over clean, unpinned pages.
//
// # Why Flush is correct
//
// Flush takes seq, the dirtySeq of the most recent clean→dirty transition. Every write
// acknowledged before Flush was called has its data in a page that is either clean (its data was
// written back by a completed backend write issued after the data was copied in: gen rules) or
// dirty with dirtySeq <= seq: a page keeps its dirtySeq until it becomes clean, and it becomes
// clean only through a successful write-back of its latest generation. Flush waits until the
// FIFO holds no page with dirtySeq <= seq, then calls the backend's Flush (SYNCHRONIZE CACHE); it
// returns nil only if that succeeds.
//
// Errors: a failed write-back leaves its pages dirty (nothing is dropped) and the flusher retries
// with exponential back-off (10 ms … 1 s). A Flush cancels the back-off, so the pages it needs
// are retried at once, and it fails (with an error satisfying block.ErrIO that wraps the
// backend's) as soon as any write-back started after the Flush began fails. Thus the next FLUSH
// after a failure fails while the backend still fails, and a FLUSH issued after the backend
// recovered succeeds with all data on the backend. Failures of write-backs started before the
// Flush are not reported by it: their pages are still dirty, so the Flush retries them itself.
//
// # Back-pressure
//
// Writers reserve a dirty page before making a clean page dirty (one reservation per request
// when all of its pages fit, page by page otherwise; rewriting a page that is dirty already needs
// none); at the dirty limit (the high watermark) they wait, honouring their context, for
// write-back to make room. WriteCached (block.CachedWriter) is the same write that never waits: a
// frontend calls it on its reader goroutine and falls back to WriteAt when it declines.
//
// The flusher writes back in the background when more than LowWater is dirty and not in flight,
// when a page is older than MaxDirtyAge, when writers are throttled, and when a Flush is waiting. It starts from the
// oldest dirty page and coalesces adjacent dirty pages into one backend write of up to
// MaxWriteBack bytes, with Workers write-backs in flight at most; when nobody waits (only the low
// watermark or the age limit calls for it), with Workers/8, so that background write-back leaves
// the CPU and the target to foreground I/O.
//
// # Locks
//
// The index is sharded by runs of 16 consecutive pages (shard.mu guards the map, valid, pins, ref
// and page data).
// c.dmu guards the dirty state (dirty, gen, inflight, the FIFO, dirtyIdx). allocMu guards slot
// allocation and the CLOCK hand. Order: allocMu → shard.mu → dmu → directMu. Read hits take one
// shard lock per run of pages (readHits) and allocate nothing.
//
// # Files
//
// cache.go holds the Cache type, its construction, the admission of calls (enter/exit) and Close;
// slots.go the page slots (the sharded index, allocation, CLOCK eviction); read.go reads (hits,
// misses, read-ahead, fills); write.go writes (copying into pages, dirty accounting and
// reservations); sync.go Flush and the write-back of a range for FUA and write-through;
// direct.go Discard and WriteZeroes, which bypass the pages; writearound.go large writes, which
// bypass them too; readaround.go large reads, which bypass them as well; streams.go the
// sequential streams both sides detect; pieces.go the cutting of backend requests at the
// backend's limits; submit.go the asynchronous one-page miss and write-around; submitaround.go
// the asynchronous read-around; writeback.go the write-back loop (the workers that pick,
// coalesce and complete background write-backs); dirtyidx.go the index of dirty pages; stats.go
// the counters and status.go the status they feed; config.go the configuration and its defaults;
// flags.go the command-line flags' strings parsed into it.
package cache
