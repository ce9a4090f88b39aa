package ublk

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// fakeAttached is a started server as serveUntilDone sees it: it records the order of calls, and
// Detach fails with detachErr.
type fakeAttached struct {
	failed    chan struct{}
	failErr   error
	detachErr error
	calls     []string
}

func (f *fakeAttached) BlockPath() string       { return "/dev/ublkb7" }
func (f *fakeAttached) Failed() <-chan struct{} { return f.failed }
func (f *fakeAttached) Err() error              { return f.failErr }
func (f *fakeAttached) Detach() error {
	f.calls = append(f.calls, "detach")
	return f.detachErr
}

// TestServeUntilDoneDetachesWithoutFlushing: on cancellation Run's loop announces the device,
// detaches once and returns nil, and never flushes the Device: the final flush is the caller's
// (the CLI's closeDevice, with progress and the second-signal abort), after Detach returns.
func TestServeUntilDoneDetachesWithoutFlushing(t *testing.T) {
	f := &fakeAttached{failed: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	var announced string
	cancel()
	err := serveUntilDone(ctx, f, func(p string) {
		announced = p
		f.calls = append(f.calls, "announce")
	})
	if err != nil {
		t.Fatalf("serveUntilDone after cancellation: %v", err)
	}
	if announced != "/dev/ublkb7" {
		t.Fatalf("announced %q", announced)
	}
	if got := len(f.calls); got != 2 || f.calls[0] != "announce" || f.calls[1] != "detach" {
		t.Fatalf("calls %v, want [announce detach]", f.calls)
	}
}

// TestServeUntilDoneReportsFailure: a server that fails on its own is detached, and Run returns
// the failure (with the detach error, if any), so the CLI exits non-zero.
func TestServeUntilDoneReportsFailure(t *testing.T) {
	errQueue := errors.New("queue 0 ended")
	errDetach := errors.New("STOP_DEV failed")
	for _, tc := range []struct {
		name      string
		detachErr error
	}{{"clean detach", nil}, {"detach fails too", errDetach}} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeAttached{failed: make(chan struct{}), failErr: errQueue, detachErr: tc.detachErr}
			close(f.failed)
			err := serveUntilDone(context.Background(), f, nil)
			if !errors.Is(err, errQueue) {
				t.Fatalf("err %v, want the queue failure", err)
			}
			if tc.detachErr != nil && !strings.Contains(err.Error(), tc.detachErr.Error()) {
				t.Fatalf("err %q does not mention the detach failure", err)
			}
			if len(f.calls) != 1 || f.calls[0] != "detach" {
				t.Fatalf("calls %v, want one detach", f.calls)
			}
		})
	}
}

// TestServeUntilDoneDetachError: a failed detach after cancellation is Run's error.
func TestServeUntilDoneDetachError(t *testing.T) {
	errDetach := errors.New("STOP_DEV failed")
	f := &fakeAttached{failed: make(chan struct{}), detachErr: errDetach}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := serveUntilDone(ctx, f, nil); !errors.Is(err, errDetach) {
		t.Fatalf("err %v, want the detach error", err)
	}
}
