package nbd

import (
	"context"
	"errors"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// fakeAttachment is a kernel device whose connections end when done closes.
type fakeAttachment struct {
	done      chan struct{}
	detachErr error
	detached  int
}

func (f *fakeAttachment) Path() string                 { return "/dev/nbd7" }
func (f *fakeAttachment) Done() <-chan struct{}        { return f.done }
func (f *fakeAttachment) Detach(context.Context) error { f.detached++; return f.detachErr }

type fakeServer struct {
	drained int
	err     error
}

func (s *fakeServer) Shutdown(context.Context) error { s.drained++; return s.err }

// TestServeUntil: whether ctx ends or the kernel drops the device, ServeUntil detaches and drains
// exactly once; only a stop by ctx with a clean detach is success, and a slow drain is a warning.
func TestServeUntil(t *testing.T) {
	detachErr := errors.New("netlink says no")
	for _, tt := range []struct {
		name      string
		dropped   bool
		detachErr error
		drainErr  error
		want      []error
		logs      []string
	}{
		{"stopped", false, nil, nil, nil, []string{"detaching"}},
		{"dropped", true, nil, nil, []error{ErrKernelDropped}, []string{"the kernel dropped every connection"}},
		{"detach fails", false, detachErr, nil, []error{detachErr}, []string{"detaching", "detach failed"}},
		{"both", true, detachErr, context.DeadlineExceeded, []error{ErrKernelDropped, detachErr},
			[]string{"the kernel dropped every connection", "detach failed", "connections cut before their requests finished"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := &fakeAttachment{done: make(chan struct{}), detachErr: tt.detachErr}
			srv := &fakeServer{err: tt.drainErr}
			ctx, cancel := context.WithCancel(context.Background())
			if tt.dropped {
				close(a.done)
			} else {
				cancel()
			}
			defer cancel()
			core, logs := observer.New(zap.DebugLevel)
			err := serveUntil(ctx, a, srv, zap.New(core))
			if (err == nil) != (len(tt.want) == 0) {
				t.Errorf("err %v, want %v", err, tt.want)
			}
			for _, w := range tt.want {
				if !errors.Is(err, w) {
					t.Errorf("err %v is not %v", err, w)
				}
			}
			if a.detached != 1 || srv.drained != 1 {
				t.Errorf("detached %d times, drained %d times", a.detached, srv.drained)
			}
			var got []string
			for _, e := range logs.All() {
				got = append(got, e.Message)
			}
			if len(got) != len(tt.logs) {
				t.Fatalf("logged %q, want %q", got, tt.logs)
			}
			for i := range got {
				if got[i] != tt.logs[i] {
					t.Errorf("logged %q, want %q", got, tt.logs)
				}
			}
		})
	}
}
