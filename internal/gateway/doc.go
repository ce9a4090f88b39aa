// Package gateway is the lifecycle of one serving process (`serve` or `attach`): its name and
// control socket (internal/service), and everything that ends or hands over its device —
// detach, a planned restart, a stop that keeps the device for a successor, a stop signal, and
// the final flush. "What happens to acknowledged data when the process stops" is answered here,
// in one place, for every frontend; cmd/iser-blk only wires flags to Options.
//
// The states live in internal/lifecycle's table; this package decides when to move. How each
// way out goes:
//
//   - Detach (control socket): refuse a held device unless forced; write back every dirty byte
//     while the device still serves (flushing); a failure returns to ready with the data kept.
//     On success the shutdown is committed (STOPPING=1) and the frontend is stopped; the final
//     flush answers the detach.
//   - Restart (control socket, `systemctl reload`): restarting (RELOADING=1); shut the gate,
//     wait for requests in flight, write back, record the state clean, then commit the
//     hand-over: log out and re-execute the binary, same PID. The kernel device is never
//     removed; the new image takes it over. Any failure before the commit reopens the gate and
//     returns to ready (READY=1).
//   - Stop --keep (control socket, `systemctl restart`): the same hand-over, and the process
//     exits 0 instead of re-executing; a successor started with the same command takes the
//     device over.
//   - A stop signal (SIGINT/SIGTERM): the shutdown is committed at once; a running detach
//     write-back or hand-over is cancelled and waited for (it gives up, reopening the gate),
//     and only then the frontend is stopped, so a restart can never re-execute over a device
//     being removed. After a hand-over committed, the signal is ignored: the new image or the
//     successor owns the device. A second signal aborts the final flush.
//
// Serve's gateway is named before login, and ServeExport (export.go) is that command's whole
// lifecycle: name, login, listen, ready, served until the context ends, then the shutdown; a
// failure before it serves closes what was opened and gives the name up. Its NBD server, and
// attach's for the kernel, are built from one NBDExport (nbdexport.go).
//
// An attach's gateway may be named only once the kernel has named its device (--ublk, --nbd
// auto); Attachment (attach.go) is that command's whole lifecycle: the name claimed before
// login when it is known, the takeover of a device a previous gateway left (recovering, then
// ready or fenced at the announce), the stop signal, and the shutdown that flushes and closes the
// stack even when the attach failed before its device existed. Its one race, a stop signal
// against the gateway's naming, is decided under Attachment.mu: the signal either finds the
// gateway and stops it through StopForSignal, or the gateway, named after it, stops at once; so
// no hand-over can begin after a stop signal.
//
// Invariants: a gateway exits 0 only when everything acknowledged is on the target; at most one
// write-back runs at a time (flushMu); a hand-over commits only if no shutdown began, and a
// shutdown never begins after a hand-over committed; detach, restart and stop run one at a
// time (internal/control's exclusive lock: the one exclusion, with the one "busy" message) and
// each may be overtaken by the shutdown, which cancels it.
//
// Lock order: Gateway.flushMu, then stopMu, then mu; Attachment.mu is a leaf, never held while
// the Gateway is called.
package gateway
