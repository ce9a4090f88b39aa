//go:build vm

package vmtest

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// AlignedBuf returns n bytes aligned for O_DIRECT.
func AlignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := int(4096 - uintptr(unsafe.Pointer(&b[0]))%4096)
	return b[off : off+n : off+n]
}

// ExpectEIO reads 4 KiB at off from the block device dev with O_DIRECT and requires the read
// to fail with EIO within the time given: a fenced device must fail I/O promptly, never hang. It
// returns how long the failure took.
func ExpectEIO(t testing.TB, dev string, off int64, within time.Duration) time.Duration {
	t.Helper()
	t0 := time.Now()
	readErr := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(dev, os.O_RDONLY|syscall.O_DIRECT, 0)
		if err == nil {
			_, err = f.ReadAt(AlignedBuf(4096), off)
			f.Close()
		}
		readErr <- err
	}()
	select {
	case err := <-readErr:
		if !errors.Is(err, syscall.EIO) {
			t.Fatalf("read of %s: %v, want EIO", dev, err)
		}
	case <-time.After(within):
		t.Fatalf("a read of %s did not fail within %v", dev, within)
	}
	return time.Since(t0)
}
