// Package blockcall makes a system call the way the Go runtime makes one it knows will take a
// while: the calling thread hands its P (the right to run Go code) to the scheduler before it
// enters the kernel, and takes one back on return (issue 37).
//
// Why: syscall.Syscall and unix.Syscall keep the P (runtime.entersyscall assumes a short call;
// sysmon takes the P back only once the call has lasted one of its ticks, ~200 µs in the TCG
// guest), and a raw system call (package rawio) keeps it for the whole call. A gateway on a
// small host runs on one P (internal/procs), so while one thread waits or copies in the kernel
// with the P, every other goroutine waits too: the iSCSI reader with the response a ublk ring
// thread is waiting for, the ring thread with the next request while a 1 MiB Data-Out is copied
// into the socket. Calls known to wait or to copy much go through Syscall6 instead; the rest keep
// the cheaper entry, since a hand-off costs thread switches (a wake-up of another thread to run
// the P) that a short call does not repay.
//
// Invariants: between runtime.entersyscallblock and runtime.exitsyscall nothing may grow the
// stack or be preempted, so Syscall6 is nosplit and makes the raw call, the shape of
// syscall.Syscall6. The runtime exports both functions for linkname and promises to keep their
// signatures (go.dev/issue/67401). package blockcalltest proves the hand-off from the runtime's
// execution trace.
package blockcall

import (
	_ "unsafe" // go:linkname

	"golang.org/x/sys/unix"
)

//go:linkname entersyscallblock runtime.entersyscallblock
func entersyscallblock()

//go:linkname exitsyscall runtime.exitsyscall
func exitsyscall()

// Syscall6 is unix.Syscall6 with the P handed off for the duration of the call.
//
//go:nosplit
func Syscall6(trap, a1, a2, a3, a4, a5, a6 uintptr) (r1, r2 uintptr, err unix.Errno) {
	entersyscallblock()
	r1, r2, err = unix.RawSyscall6(trap, a1, a2, a3, a4, a5, a6)
	exitsyscall()
	return r1, r2, err
}
