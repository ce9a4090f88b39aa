package uring

import (
	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/internal/blockcall"
)

// A wait in io_uring_enter tells the Go scheduler that it blocks (issue 37).
//
// unix.Syscall6 marks the calling thread as in a system call but lets it keep its P (the right
// to run Go code): the runtime assumes a short call, and only sysmon takes the P back once the
// call has lasted one of its ticks (20 µs asked, ~200 µs measured in the TCG guest). A ublk ring
// thread waits in io_uring_enter for its next request, for as long as the disk is idle, and the
// gateway runs on one P on small hosts (internal/procs). So every goroutine that had work meanwhile
// (the iSCSI reader with the response the ring thread is waiting for) waited for sysmon's tick,
// and sysmon, taking a P back on each, stayed in its busy mode: a trace of ublk over TCP at QD1
// found one thread — sysmon — taking 8.5 of the gateway's 14 context switches per I/O
// (docs/bench/findings-20261206-session30-sched-trace.md).
//
// enterBlocking is io_uring_enter through runtime.entersyscallblock instead (internal/blockcall),
// the runtime's own way into a call known to block (os/signal's receiver waits through it,
// notetsleepg): the P is handed off at once, to a thread with work if there is any, and idles
// otherwise; on return the thread takes an idle P back if there is one, as after any system call.
func enterBlocking(fd, toSubmit, minComplete, flags uintptr) (uintptr, unix.Errno) {
	n, _, errno := blockcall.Syscall6(unix.SYS_IO_URING_ENTER, fd, toSubmit, minComplete, flags, 0, 0)
	return n, errno
}
