// Package journal is iser-blk's persistent write-back cache (--cache-dev): a block.Device in
// front of the target that keeps every write in a log on a local file or block device (the
// cache device), makes a Flush durable there with fdatasync, and writes the log back to the
// target later, in LBA order. It behaves like a disk with a volatile write cache whose cache
// survives the process: after kill -9 every acknowledged write is served again, after a power cut
// every write acknowledged before the last completed Flush. The on-disk format, the recovery
// rules and the memory it takes are in docs/cache-dev.md.
//
// # Invariants
//
//   - The index (index.go) equals the replay of the log from the checkpoint to the head: a
//     block is in it exactly when the batches between them hold a copy of it that no later
//     batch replaced or invalidated, and it names the newest such copy. Appending a batch applies
//     it to the index; a write-back round drops the blocks it wrote back before it advances the
//     checkpoint past them. Recovery rebuilds the index by that same replay.
//   - The target has, durably, every block whose newest copy lies before the checkpoint: a round
//     writes the newest copies of its batches' blocks, flushes the target and syncs the log
//     before the superblock records the checkpoint, and only then are those units reused.
//   - Nothing older than an operation that went around the log is ever replayed over it: the
//     log's data of its range is written back first and an invalidation entry logged (io.go).
//   - A batch is acknowledged only after it is written (in the page cache, so kill -9 keeps
//     it); batches are written one at a time in sequence order, so a Flush's fdatasync covers
//     every batch acknowledged before it and recovery finds them as an unbroken chain.
//   - Units are reused only after the checkpoint passed them and no reader still reads them (rmu).
//
// A write of part of a unit is merged with the unit's contents, read from the log or else from
// the target; a discard, a write-zeroes or a large write over the same unit may be in flight on
// the target meanwhile. Claims (claims.go) make the two happen one after the other, so the merge
// never reads a unit mid-operation.
//
// # Locks
//
// rmu (readers of ring units, shared; the reclaim of units, exclusive) → mu (index, ring
// positions, write-backs in flight, claims, failure). cleanMu serialises write-back rounds and the
// write-back of a range before an invalidation; it is taken before rmu and mu. amu guards the
// queue of appends and is never held with the others. syncMu serialises fdatasync and the
// target's flush.
//
// # Files
//
// format.go the on-disk structures and their codecs; media.go the cache device; index.go the
// index; open.go opening, formatting and the identity check; recover.go recovery; append.go
// the batch writer (group commit, merges of partial units, the wrap of the ring); claims.go
// merges kept apart from operations around the log; io.go the
// block.Device operations; clean.go the write-back; journal.go the type, its options and
// closing; stats.go the counters, status and metrics.
package journal
