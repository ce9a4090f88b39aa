package cache

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache/internal/fakedev"
)

// TestStatusThrottledSeconds checks that the status reports the time writers waited for dirty
// room: zero while nobody waited, and at least the time a writer was held at the dirty limit
// (here until its context's deadline, while the write-backs that would make room are held).
func TestStatusThrottledSeconds(t *testing.T) {
	c, dev := newTest(t, 4<<20, stdLimits(4096), Config{Size: 1 << 20, DirtyLimit: 64 << 10, MaxDirtyAge: time.Hour})
	if s := c.CacheStatus().ThrottledSeconds; s != 0 {
		t.Fatalf("throttled %v s before any write", s)
	}
	_, release := blockingWrites(dev, 0, 4<<20)
	defer close(release)
	const wait = 30 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var err error
	for i := int64(0); i < 64 && err == nil; i++ {
		err = c.WriteAt(ctx, fill(4096, byte(i)), i*4096, 0)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("writer at the limit: %v, want the context's error", err)
	}
	dev.SetBefore(nil)
	if s := c.CacheStatus().ThrottledSeconds; s < wait.Seconds()/2 || s > 10 {
		t.Fatalf("throttled %v s, want about %v", s, wait.Seconds())
	}
}

// TestStatusLastWriteBackError checks that the status reports the latest failed write-back, its
// error and when it failed, and nothing before the first failure.
func TestStatusLastWriteBackError(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 1<<20, stdLimits(4096), Config{Size: 1 << 20, MaxDirtyAge: time.Hour})
	if err := c.WriteAt(ctx, fill(4096, 1), 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if st := c.CacheStatus(); st.LastWriteBackError != "" || st.LastWriteBackAt != nil {
		t.Fatalf("a write-back error reported before any failed: %q at %v", st.LastWriteBackError, st.LastWriteBackAt)
	}
	dev.SetFault(func(op fakedev.Op) error {
		if op.Kind == fakedev.Write {
			return fmt.Errorf("fake target: medium error: %w", block.ErrIO)
		}
		return nil
	})
	before := time.Now()
	if err := c.WriteAt(ctx, fill(4096, 2), 8192, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(ctx); err == nil {
		t.Fatal("Flush succeeded with a failing backend")
	}
	after := time.Now()
	dev.SetFault(nil)
	st := c.CacheStatus()
	if !strings.Contains(st.LastWriteBackError, "medium error") || !strings.Contains(st.LastWriteBackError, "write-back [8192, +4096)") {
		t.Fatalf("last write-back error %q", st.LastWriteBackError)
	}
	if st.LastWriteBackAt == nil || st.LastWriteBackAt.Before(before) || st.LastWriteBackAt.After(after) {
		t.Fatalf("last write-back error at %v, want within [%v, %v]", st.LastWriteBackAt, before, after)
	}
	if err := c.Flush(ctx); err != nil { // recovered: the error stays as the latest one
		t.Fatal(err)
	}
	if st2 := c.CacheStatus(); st2.LastWriteBackError != st.LastWriteBackError || !st2.LastWriteBackAt.Equal(*st.LastWriteBackAt) {
		t.Fatalf("the latest write-back error changed without a failure: %q at %v", st2.LastWriteBackError, st2.LastWriteBackAt)
	}
}
