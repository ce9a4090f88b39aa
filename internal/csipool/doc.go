// Package csipool is the CSI controller service of iser-blk for arrays without a management API:
// it hands out LUNs from a pool the administrator provisioned beforehand. The pool file lists the
// LUNs (pool.go: one target URL per line, other portals of the same LUN after a comma, `#`
// comments); each LUN's size is read from the LUN itself (sizes.go: READ CAPACITY through
// backend/iser, behind the Prober interface so tests fake it); CreateVolume claims the smallest
// free LUN that fits the capacity range and DeleteVolume returns it (controller.go). Claims live
// in a JSON file written atomically (claims.go), so a controller restart hands out nothing twice.
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
// Wiring (the `iser-blk csi --pool FILE` command): ReadPool(FILE); New(Config{Pool, Prober:
// ISERProber{Options: login options with the host's initiator name, and CHAP from the
// environment}, Logger}); csi.RegisterControllerServer(server, controller); optionally
// go controller.Probe(ctx) so the first CreateVolume finds the sizes known; Close at exit. The
// Identity service then advertises CONTROLLER_SERVICE. The claims file defaults to
// DefaultClaimsFile, the path the manifests keep on a host directory.
//
// Lock order: Controller.mu (claims) may be held while taking sizeCache.mu (a leaf, held only for
// map access). Probing the LUNs (network I/O, seconds per unreachable portal) happens under
// sizeCache.probing, a one-slot semaphore that is never taken while Controller.mu is held, so a
// slow probe delays no ListVolumes, DeleteVolume or idempotent CreateVolume.
//
// Not built here: erasing a LUN on DeleteVolume (the next claimant reads the previous one's
// blocks; see docs/kubernetes.md), snapshots, clones, expansion and topology.
package csipool
