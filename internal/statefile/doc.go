// Package statefile keeps what a successor gateway needs to take over a kernel block device that
// its predecessor served: RUNDIR/NAME.json, written atomically (temp file, fsync, rename, fsync
// of the directory) so that a crash at any instant leaves either the old or the new state, never
// a torn one.
//
// Invariants:
//   - A State says Dirty exactly while acknowledged writes may be missing from the target: it is
//     written clean before the device serves its first request (Fresh), Dirty before the first
//     write after a clean point is acknowledged, and clean again after a flush leaves nothing
//     dirty or a shutdown, restart or stop --keep has written every dirty byte back
//     (internal/gate, internal/takeover). A successor that finds a Dirty state must not resume
//     the device (Resumable says why): writes the predecessor acknowledged may never have reached
//     the target, and a filesystem that went on would later believe them durable. A successor that
//     takes such a device over (fenced) records Dirty whatever its own cache mode, and Resumable
//     refuses any Dirty state: the fence passes on until the device is detached.
//   - Decoding untrusted bytes never panics; a file that is not a State of this Version, or whose
//     identity is another LUN's, is a typed error (ErrCorrupt, ErrVersion, ErrForeign), never a
//     guess.
package statefile
