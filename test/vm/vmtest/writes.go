//go:build vm

package vmtest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// DiskWrites is the number of writes the block device dev (/dev/NAME or NAME) has completed since
// it appeared: the fifth field of /sys/block/NAME/stat.
func DiskWrites(t testing.TB, dev string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "stat"))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) < 5 {
		t.Fatalf("%s: short stat %q", dev, b)
	}
	n, err := strconv.ParseInt(f[4], 10, 64)
	if err != nil {
		t.Fatalf("%s stat %q: %v", dev, f, err)
	}
	return n
}

// WaitWrites waits, for at most 2 min, until dev has completed want writes. With done, the
// channel a writer's exit status arrives on, a writer that ends first fails the test (the status
// is put back for whoever waits for it next).
func WaitWrites(t testing.TB, dev string, want int64, done chan error) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for DiskWrites(t, dev) < want {
		if done != nil {
			select {
			case err := <-done:
				done <- err
				t.Fatalf("the writer ended (%v) before %s reached %d writes", err, dev, want)
			default:
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not reach %d completed writes in 2 min (at %d)", dev, want, DiskWrites(t, dev))
		}
		time.Sleep(20 * time.Millisecond) // polling a counter, not synchronising
	}
}

// KillAt is the write count at which the kill-loop tests kill (or restart) the gateway for the
// i-th time (from 0): every 900 writes since firstWrite, the count when their fio started, plus
// up to 199 so that each run kills at a different point of the request stream. The third comes
// by the 2,899th write, which leaves fio writing through the last successor when it writes 4,096.
func KillAt(firstWrite int64, i int) int64 {
	return firstWrite + int64(i+1)*900 + time.Now().UnixNano()%200
}
