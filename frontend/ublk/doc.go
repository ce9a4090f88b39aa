// Package ublk serves a block.Device as a Linux ublk disk, /dev/ublkbN (kernel ublk_drv,
// include/uapi/linux/ublk_cmd.h; Documentation/block/ublk.rst).
//
// Control path: commands on /dev/ublk-control go through an io_uring as IORING_OP_URING_CMD with
// ioctl-encoded opcodes (UBLK_U_CMD_*): GET_FEATURES, ADD_DEV, SET_PARAMS, START_DEV, STOP_DEV,
// DEL_DEV, GET_DEV_INFO (Control).
//
// Data path: per hardware queue, one io_uring on one locked OS thread holds a FETCH_REQ for every
// tag; when the kernel has a request for a tag the FETCH completes, the ring thread copies the
// tag's descriptor (from the read-only mmap of /dev/ublkcN) and hands it to that tag's worker
// goroutine. The worker calls the Device and queues its result; an eventfd, on which the ring
// keeps an IORING_OP_READ armed, wakes the ring thread, which sends COMMIT_AND_FETCH_REQ (the
// result, plus the FETCH of the tag's next request). The ring thread never calls the Device, so
// one slow request never delays the others (Longhorn measured an asynchronous ublk server at
// 3-4x the IOPS of tgtd; synchronous Go servers stall a whole queue behind one round trip).
//
// The ring thread's waits in io_uring_enter hand its P to the Go scheduler (uring/enter.go), so
// the goroutines it waits for (the iSCSI reader) run at once on a one-P gateway, unless many
// small requests are in flight, where keeping it lets their completions come in batches
// (queue.waitKeepsP).
//
// Data buffers: each tag has a fixed buffer of the negotiated maximum request size, taken from
// the BufferPool; its address is the `addr` of every FETCH/COMMIT, so the kernel copies WRITE
// data into it before the FETCH completes and copies READ data out of it when the COMMIT is
// processed. With the RDMA pool that copy lands in registered memory: the CLI hands ublk the
// stack's pool, which it registered for RDMA before opening the target.
//
// Life of a device (Start, then Shutdown or Detach; Run is Start + wait + Detach): Start creates
// it (ADD_DEV, SET_PARAMS, every queue's FETCH_REQs, START_DEV) and removes whatever exists if a
// step fails. The end is STOP_DEV (the disk goes; requests already queued are still served and
// waited for, with a drain timeout that cancels a backend request that never returns), then the
// final flush, then teardown and DEL_DEV (shutdown.go). Shutdown flushes the Device itself;
// Detach, which Run uses, leaves the flush to the caller so that the CLI's shutdown flush (with
// progress lines and the second-signal abort) is the one that makes acknowledged data durable.
//
// Files: abi.go (ublk_cmd.h structures), control.go (control commands), params.go (limits to
// ublk_params), fit.go (the request size whose tag buffers fit a pool budget), server.go (Start), queue.go (the per-queue ring thread and tag workers),
// serve.go (one request on the Device), shutdown.go (the shutdown order), run.go (Run).
//
// Invariants:
//   - A tag is in exactly one place: parked in the kernel (FETCH outstanding), or in service
//     (its worker owns the buffer), or queued for commit. The buffer is touched only by the owner.
//   - READ/WRITE succeed only with the full byte count (the driver requeues a short remainder);
//     errors are negative errnos from block.Errno.
//   - The server does not use USER_RECOVERY, so the kernel never waits for a dead server.
//   - The kernel device is removed only after every request it handed the server has been
//     answered (STOP_DEV returns after the drain), and once Shutdown or Detach has returned no
//     request reaches the Device again: the driver aborted every parked FETCH and the queues
//     are gone.
//
// What the kernel (6.12) does when the server dies (kill -9, crash): the process's io_urings are
// torn down, which cancels the FETCH commands parked in the driver; the driver's cancel handler
// marks the queue canceling, fails every request the server had taken with EIO, fails new
// requests immediately, and schedules its stop work, which removes /dev/ublkbN (del_gendisk).
// If every tag of a queue was in the server's hands (no parked FETCH to cancel), nothing happens
// until the block layer's request timeout (/sys/block/ublkbN/queue/io_timeout, 30 s by default)
// fires: ublk_timeout sees the dead daemon and does the same abort. Measured in the 6.12 guest
// (TestVMKill9 under fio, 2 queues × 64): fio got errors 0.24-1.1 s after the kill, or 30.9 s in
// the all-tags-taken case; the disk node was gone by then. /dev/ublkcN and the control-side
// device stay (state dead) until someone sends DEL_DEV. A live but hung server is never timed out
// (privileged ublk resets the timer), so a hung backend must time out its own requests.
//
// That is for a device created without recovery (Options.Recovery zero, the default). A
// recoverable device (RecoveryReissue) is instead quiesced at the death: the disk stays, the
// requests the server had taken are requeued, new ones wait, and Recover hands the device to a
// new server (recovery.go). Invariant: Recover never deletes a device, whatever fails.
package ublk
