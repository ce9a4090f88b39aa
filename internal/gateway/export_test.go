package gateway

import (
	"context"
	"errors"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/service"
	"github.com/iser-blk/iser-blk/internal/status"
)

// exportFixture is serve's steps over a 1 MiB memory LUN in a run directory of its own: each
// step records that it ran and fails with the error the test sets.
type exportFixture struct {
	dir                string
	dev                block.Device
	g                  *Gateway
	openErr, listenErr error
	serveErr           error
	steps              []string
}

func newExportFixture(t *testing.T) *exportFixture {
	return &exportFixture{dir: t.TempDir(), dev: memDevice(t, 1<<20)}
}

func (f *exportFixture) options(t *testing.T) ExportOptions {
	log := zaptest.NewLogger(t)
	return ExportOptions{
		Start: func() (*Gateway, error) {
			f.steps = append(f.steps, "start")
			g, err := Start(Options{
				Service:  service.Options{RunDir: f.dir, Identity: status.Identity{Name: "gw", Device: "gw", FrontendKind: modes.NBDSocket}},
				Counters: new(status.IOCounters),
				Log:      log,
				Process:  (&fakeProcess{}).process(t),
			})
			if err == nil {
				f.g = g
				t.Cleanup(func() { _ = g.Service().Close() })
			}
			return g, err
		},
		Open: func() (block.Device, error) {
			f.steps = append(f.steps, "open")
			if f.openErr != nil {
				return nil, f.openErr
			}
			return f.dev, nil
		},
		Listen: func(block.Device) (Export, error) {
			f.steps = append(f.steps, "listen")
			if f.listenErr != nil {
				return Export{}, f.listenErr
			}
			return Export{
				Announce: func() {
					s, _ := f.g.State()
					f.steps = append(f.steps, "announce at "+string(s))
				},
				Serve: func(context.Context) error {
					s, _ := f.g.State()
					f.steps = append(f.steps, "serve at "+string(s))
					return f.serveErr
				},
			}, nil
		},
		Frontend: status.Frontend{Kind: modes.NBDSocket},
	}
}

// wantNameFree fails unless a second gateway can take the fixture's name.
func (f *exportFixture) wantNameFree(t *testing.T) {
	t.Helper()
	again := &exportFixture{dir: f.dir, dev: memDevice(t, 1<<20)}
	g, err := again.options(t).Start()
	if err != nil {
		t.Fatalf("the name is still held: %v", err)
	}
	g.Abandon()
}

// serve's steps run in order: the name before login, the lifecycle at ready only once the
// export listens and was announced; at the end the device is flushed and closed and the name
// given up. A serving loop that failed makes the exit code 1.
func TestServeExport(t *testing.T) {
	for _, serveErr := range []error{nil, errors.New("accept failed")} {
		f := newExportFixture(t)
		f.serveErr = serveErr
		code, err := ServeExport(context.Background(), f.options(t))
		want := ExitOK
		if serveErr != nil {
			want = ExitFailure
		}
		if err != nil || code != want {
			t.Fatalf("serve error %v: ServeExport = %d, %v; want %d", serveErr, code, err, want)
		}
		wantSteps := []string{"start", "open", "listen", "announce at " + string(lifecycle.Starting), "serve at " + string(lifecycle.Ready)}
		if len(f.steps) != len(wantSteps) {
			t.Fatalf("steps %q, want %q", f.steps, wantSteps)
		}
		for i := range wantSteps {
			if f.steps[i] != wantSteps[i] {
				t.Fatalf("steps %q, want %q", f.steps, wantSteps)
			}
		}
		wantState(t, f.g, lifecycle.Stopped, "")
		wantClosed(t, f.dev)
		f.wantNameFree(t)
	}
}

// A failure before the export serves is returned for the caller's exit code, with the name
// given up and an opened device closed (logged out); later steps never run.
func TestServeExportFailsBeforeServing(t *testing.T) {
	cause := errors.New("the step failed")
	for _, tc := range []struct {
		name      string
		set       func(f *exportFixture)
		wantSteps int
	}{
		{"login", func(f *exportFixture) { f.openErr = cause }, 2},
		{"listen", func(f *exportFixture) { f.listenErr = cause }, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newExportFixture(t)
			tc.set(f)
			if _, err := ServeExport(context.Background(), f.options(t)); !errors.Is(err, cause) {
				t.Fatalf("ServeExport: %v, want %v", err, cause)
			}
			if len(f.steps) != tc.wantSteps {
				t.Fatalf("steps %q: want only the first %d", f.steps, tc.wantSteps)
			}
			wantState(t, f.g, lifecycle.Stopped, "failed to start")
			if tc.name == "listen" {
				wantClosed(t, f.dev)
			}
			f.wantNameFree(t)
		})
	}
}

// A name held by a running gateway stops serve before it logs in.
func TestServeExportNameInUse(t *testing.T) {
	first := newExportFixture(t)
	g, err := first.options(t).Start()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Abandon()
	second := &exportFixture{dir: first.dir, dev: memDevice(t, 1<<20)}
	if _, err := ServeExport(context.Background(), second.options(t)); err == nil {
		t.Fatal("a second gateway by the name served")
	}
	if len(second.steps) != 1 {
		t.Fatalf("steps %q: a second gateway by the name went on past its name", second.steps)
	}
}
