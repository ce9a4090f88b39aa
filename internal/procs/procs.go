// Package procs tunes the Go runtime's processor count to the gateway's work (SmallHost).
package procs

import (
	"os"
	"runtime"
)

// SmallHost sets GOMAXPROCS to 1 on hosts with at most two CPUs, unless the GOMAXPROCS
// environment variable says otherwise.
//
// Why: the gateway's work per I/O is a few syscalls and goroutine hand-offs. With a second P
// idle, every hand-off wakes another OS thread that spins looking for work and goes back to
// sleep (futex wake/wait per hop); on two cores that CPU is taken from the target, the kernel's
// network stack and the NBD client. Measured with make bench's fio jobs against tgtd on this
// 2-core machine (cache off, alternating runs, loaded machine): 4k randread QD1 p50 130.6/74.2 µs
// with 1 P vs 146.4/162.8 µs with 2, gateway CPU 74/50 vs 93/110 µs per I/O; QD32 28.9k/18.7k vs
// 14.8k/26.2k IOPS (19.9/27.7 vs 43.5/23.0 µs per I/O); 1 MiB reads 1018/628 vs 830/1007 MiB/s.
func SmallHost() {
	if _, set := os.LookupEnv("GOMAXPROCS"); set {
		return
	}
	if runtime.NumCPU() <= 2 {
		runtime.GOMAXPROCS(1)
	}
}
