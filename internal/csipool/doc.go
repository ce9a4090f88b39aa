// Package csipool is the CSI controller service of iser-blk for arrays without a management API:
// it hands out LUNs from a pool the administrator provisioned beforehand. The pool file lists the
// LUNs (pool.go: one target URL per line, other portals of the same LUN after a comma, `#`
// comments); each LUN's size is read from the LUN itself (sizes.go: READ CAPACITY through
// backend/iser, behind the Prober interface so tests fake it); CreateVolume claims the smallest
// free LUN that fits the capacity range (create.go) and DeleteVolume returns it (controller.go)
// to be zeroed in the background before it is free again (erasing.go runs the erases; erase.go
// zeroes a LUN through backend/iser, behind the Eraser interface). Claims and erasing LUNs live in a JSON file
// written atomically (claims.go), so a controller restart hands out nothing twice, and nothing
// unerased.
// The volume context a volume carries to the node plugin (context.go: target, transport, frontend,
// cache) is the one contract between this package and the node side, which may run in the same
// process or elsewhere.
//
// Invariants:
//   - A LUN is claimed by at most one volume, in memory and in the claims file alike. A claim
//     reaches the claims file (fsynced, renamed, directory fsynced) before CreateVolume answers,
//     and a release before DeleteVolume answers; if the file cannot be written the call fails
//     and memory is left as it was. Every write replaces the whole file with memory's claims,
//     so a write that failed half-way (renamed, directory not synced) is made good by the next.
//   - A LUN is free (CreateVolume may claim it, GetCapacity counts it, Probe reads it) only when
//     no claim holds it and it is not erasing. A released LUN is erasing (in the file before
//     DeleteVolume answers) until an Erase returned nil (every block zeroes, flushed, a sample
//     read back) and the file no longer lists it; a failed erase is retried with a back-off for
//     the controller's life and restarted by the next start. Only NoErase frees a LUN unerased.
//     A LUN outside the pool file is never written to.
//   - Volume IDs are random and never reused, so a stale DeleteVolume retried after its LUN
//     went to another volume cannot free the new volume's LUN.
//   - CreateVolume is idempotent by name: the same name with a compatible request returns the
//     same volume; with an incompatible one, AlreadyExists. DeleteVolume of an unknown ID succeeds.
//   - One process owns a claims file at a time (an exclusive flock on FILE.lock, held until
//     Close): two controllers handing out from one file would each think a LUN free.
//   - Decoding the pool file and the claims file never panics; every error names the line (pool)
//     or says what is wrong (claims), never a guess.
//   - A LUN whose size cannot be read is skipped with the reason logged, and probed again after
//     a back-off; it never fails the controller.
//
// Wiring (the `iser-blk csi --pool FILE` command): ReadPool(FILE); NewISER(Config{Pool,
// ClaimsFile, NoErase with --pool-erase none, Logger}, LoginOptions(the host's initiator
// name)), which is New with an ISERProber and an ISEREraser logging in with those options
// (CHAP from the environment); csi.RegisterControllerServer(server, controller); optionally
// go controller.Probe(ctx) so the first CreateVolume finds the sizes known; Close at exit (it
// interrupts the erases). The Identity service then advertises CONTROLLER_SERVICE. The claims
// file defaults to DefaultClaimsFile, the path the manifests keep on a host directory.
//
// Lock order: Controller.mu (claims) may be held while taking sizeCache.mu (a leaf, held only for
// map access). Probing the LUNs (network I/O, seconds per unreachable portal) happens under
// sizeCache.probing, a one-slot semaphore that is never taken while Controller.mu is held, so a
// slow probe delays no ListVolumes, DeleteVolume or idempotent CreateVolume. Erases (network
// I/O, minutes per LUN) run on their own goroutines, at most eraseParallel at once, and take
// Controller.mu only to record their end; Close takes it to stop new erases starting, then waits
// for the running ones without it.
//
// Not built here: snapshots, clones, expansion and topology.
package csipool
