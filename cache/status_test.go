package cache

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache/internal/fakedev"
)

// The status's ThrottledSeconds is checked by TestThrottledWriterHonoursContext.

// TestStatusLastWriteBackError checks that the status reports the latest failed write-back, its
// error and when it failed, and the count of failures (the metrics' write_back_errors_total),
// and nothing before the first failure.
func TestStatusLastWriteBackError(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 1<<20, stdLimits(4096), Config{Size: 1 << 20, MaxDirtyAge: time.Hour})
	if err := c.WriteAt(ctx, fill(4096, 1), 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if st := c.CacheStatus(); st.LastWriteBackError != "" || st.LastWriteBackAt != nil || st.WriteBackErrors != 0 {
		t.Fatalf("a write-back error reported before any failed: %q at %v (%d)", st.LastWriteBackError, st.LastWriteBackAt, st.WriteBackErrors)
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
	if st.WriteBackErrors == 0 || st.WriteBackErrors != c.Stats().WriteBackErrors {
		t.Fatalf("write_back_errors %d, Stats says %d", st.WriteBackErrors, c.Stats().WriteBackErrors)
	}
	if err := c.Flush(ctx); err != nil { // recovered: the error stays as the latest one
		t.Fatal(err)
	}
	if st2 := c.CacheStatus(); st2.LastWriteBackError != st.LastWriteBackError || !st2.LastWriteBackAt.Equal(*st.LastWriteBackAt) {
		t.Fatalf("the latest write-back error changed without a failure: %q at %v", st2.LastWriteBackError, st2.LastWriteBackAt)
	}
}
