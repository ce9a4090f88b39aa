package rdma

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// allocMem maps n bytes of anonymous memory outside the Go heap, suitable for registration.
// Free it with freeMem once nothing registered refers to it.
func allocMem(n int) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", n, err)
	}
	return b, nil
}

// freeMem unmaps memory from allocMem.
func freeMem(b []byte) error {
	if b == nil {
		return nil
	}
	return unix.Munmap(b)
}
