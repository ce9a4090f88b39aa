package syncbuf

import (
	"strings"
	"sync"
	"testing"
)

// TestConcurrentWriteAndRead: every write is kept whole while another goroutine reads (run with
// -race: the mutex is what makes that legal).
func TestConcurrentWriteAndRead(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 1000 {
			if n, err := b.Write([]byte("line\n")); n != 5 || err != nil {
				t.Errorf("Write = %d, %v", n, err)
				return
			}
		}
	}()
	for range 100 {
		if s := b.String(); len(s)%5 != 0 {
			t.Fatalf("read a torn write: %d bytes", len(s))
		}
	}
	wg.Wait()
	if got := strings.Count(b.String(), "line\n"); got != 1000 {
		t.Fatalf("%d lines, want 1000", got)
	}
}
