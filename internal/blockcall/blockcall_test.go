package blockcall_test

import (
	"bytes"
	"fmt"
	"runtime"
	"runtime/trace"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/internal/blockcall"
	"github.com/iser-blk/iser-blk/internal/blockcall/blockcalltest"
)

// TestSyscall6HandsOffP: a read that blocks on a pipe, made through Syscall6, releases the P
// from its own thread before the writer runs; the same read through unix.Syscall6 does not
// (sysmon takes the P, from its thread). At GOMAXPROCS=1 the writer runs only once the P is
// free, so in both cases the write finds the reader in its call.
func TestSyscall6HandsOffP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, handOff := range []bool{true, false} {
		t.Run(fmt.Sprintf("handOff=%v", handOff), func(t *testing.T) {
			read := unix.Syscall6
			if handOff {
				read = blockcall.Syscall6
			}
			const rounds, minWaited = 30, 5
			rs := pipeRounds(t, rounds, read)
			waited := 0
			for i, r := range rs {
				if !r.Marked || !r.InSyscall {
					continue // the write came before the read entered the kernel
				}
				waited++
				if r.Released != handOff {
					t.Errorf("round %d: the reader's thread released its P in the call: %v, want %v", i, r.Released, handOff)
				}
			}
			if waited < minWaited {
				t.Fatalf("only %d of %d writes found the reader in its call", waited, rounds)
			}
		})
	}
}

// pipeRounds has a goroutine read a blocking pipe with read, rounds times, while another writes
// it, under the execution tracer.
func pipeRounds(t *testing.T, rounds int, read func(trap, a1, a2, a3, a4, a5, a6 uintptr) (uintptr, uintptr, unix.Errno)) []blockcalltest.Round {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil { // blocking: the read waits in the kernel
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	var tr bytes.Buffer
	if err := trace.Start(&tr); err != nil {
		t.Skipf("the execution tracer is in use: %v", err) // go test -trace
	}
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		var b [1]byte
		for i := range rounds {
			ready <- struct{}{} // the writer is readied; this goroutine goes on to read
			blockcalltest.Begin(i)
			if _, _, e := read(unix.SYS_READ, uintptr(p[0]), uintptr(unsafe.Pointer(&b[0])), 1, 0, 0, 0); e != 0 {
				done <- e
				return
			}
		}
		done <- nil
	}()
	for i := range rounds {
		<-ready
		blockcalltest.End(i)
		if _, err := unix.Write(p[1], []byte{1}); err != nil {
			t.Fatal(err)
		}
	}
	err := <-done
	trace.Stop()
	if err != nil {
		t.Fatal(err)
	}
	rs, err := blockcalltest.Rounds(&tr, rounds)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}
