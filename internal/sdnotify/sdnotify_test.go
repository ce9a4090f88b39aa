package sdnotify

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/sdnotify/sdnotifytest"
)

func TestLifecycleNotifications(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	lm := lifecycle.New()
	lm.Subscribe(New(nil, 45*time.Second))
	steps := []struct {
		do   func()
		want []string
		not  []string
	}{
		{func() { _ = lm.To(lifecycle.Ready, "") }, []string{"READY=1", "STATUS=ready"}, nil},
		// A planned restart is a reload; one that fails ends it with READY=1.
		{func() { _ = lm.To(lifecycle.Restarting, "restart requested") }, []string{"RELOADING=1", "MONOTONIC_USEC=", "STATUS=restarting"}, []string{"STOPPING=1", "READY=1"}},
		{func() { _ = lm.To(lifecycle.Ready, "restart failed") }, []string{"READY=1"}, []string{"STOPPING=1"}},
		// A detach's write-back may still fail and return to ready: no STOPPING=1 until it commits.
		{func() { _ = lm.To(lifecycle.Flushing, "write-back before detach") }, []string{"STATUS=flushing"}, []string{"STOPPING=1"}},
		{func() { _ = lm.CommitTo(lifecycle.Draining, "SIGTERM") }, []string{"STOPPING=1", "STATUS=draining: SIGTERM"}, []string{"READY=1"}},
		{func() { _ = lm.To(lifecycle.Flushing, "") }, []string{"STATUS=flushing"}, []string{"STOPPING=1"}},
		{func() { lm.ReportFlush(lifecycle.FlushProgress{DirtyBytes: 3 << 20, WrittenBackBytes: 1 << 20}) },
			[]string{"EXTEND_TIMEOUT_USEC=45000000", "STATUS=flushing: 3.0 MiB dirty, 1.0 MiB written back"}, nil},
		// No bytes written back since: the status is updated, the timeout is not extended.
		{func() { lm.ReportFlush(lifecycle.FlushProgress{DirtyBytes: 3 << 20, WrittenBackBytes: 1 << 20}) },
			[]string{"STATUS=flushing"}, []string{"EXTEND_TIMEOUT_USEC"}},
		{func() { lm.ReportFlush(lifecycle.FlushProgress{WrittenBackBytes: 4 << 20}) },
			[]string{"EXTEND_TIMEOUT_USEC=45000000"}, nil},
		{func() { _ = lm.To(lifecycle.Stopped, "") }, []string{"STATUS=stopped"}, nil},
	}
	for i, s := range steps {
		s.do()
		got := sock.Receive()
		lines := strings.Split(got, "\n")
		for _, w := range s.want {
			if !hasPrefixLine(lines, w) {
				t.Errorf("step %d: %q lacks %q", i, got, w)
			}
		}
		for _, n := range s.not {
			if hasPrefixLine(lines, n) {
				t.Errorf("step %d: %q has %q", i, got, n)
			}
		}
	}
}

func hasPrefixLine(lines []string, prefix string) bool {
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}

func TestFailedStateCarriesReason(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	lm := lifecycle.New()
	lm.Subscribe(New(nil, 0))
	_ = lm.To(lifecycle.Failed, "login: authentication failure")
	if got := sock.Receive(); got != "STATUS=failed: login: authentication failure" {
		t.Fatalf("got %q", got)
	}
}

func TestWatchdogPings(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	t.Setenv("WATCHDOG_USEC", "20000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- New(nil, 0).RunWatchdog(ctx, nil) }()
	for i := 0; i < 2; i++ {
		if got := sock.Receive(); got != "WATCHDOG=1" {
			t.Fatalf("ping %d: %q", i, got)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestWatchdogOffReturnsAtOnce(t *testing.T) {
	sdnotifytest.Listen(t)
	t.Setenv("WATCHDOG_USEC", "")
	if err := New(nil, 0).RunWatchdog(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
}

func TestWithoutNotifySocketNothingIsSent(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	sent, err := New(nil, 0).Send("READY=1")
	if sent || err != nil {
		t.Fatalf("sent %v err %v without NOTIFY_SOCKET", sent, err)
	}
}
