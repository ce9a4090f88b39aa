package blockcall_test

import (
	"fmt"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/internal/blockcall"
	"github.com/iser-blk/iser-blk/internal/blockcall/blockcalltest"
)

// TestSyscall6HandsOffP: a read that blocks on a pipe, made through Syscall6, releases the P
// from its own thread before the writer runs; the same read through unix.Syscall6 does not
// (sysmon takes the P, from its thread). The second case shows that the trace tells them apart.
func TestSyscall6HandsOffP(t *testing.T) {
	for _, handOff := range []bool{true, false} {
		t.Run(fmt.Sprintf("handOff=%v", handOff), func(t *testing.T) {
			read := unix.Syscall6
			if handOff {
				read = blockcall.Syscall6
			}
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil { // blocking: the read waits in the kernel
				t.Fatal(err)
			}
			defer unix.Close(p[0])
			defer unix.Close(p[1])
			var b [1]byte
			rs := blockcalltest.Run(t, blockcalltest.Waits{Rounds: 30,
				Wait: func(int) error {
					if _, _, e := read(unix.SYS_READ, uintptr(p[0]), uintptr(unsafe.Pointer(&b[0])), 1, 0, 0, 0); e != 0 {
						return e
					}
					return nil
				},
				Wake: func(int) error { _, err := unix.Write(p[1], []byte{1}); return err },
			})
			blockcalltest.Expect(t, rs, handOff, 5)
		})
	}
}
