package gateway

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/iser-blk/iser-blk/backend/memdev/memdevtest"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/service"
	"github.com/iser-blk/iser-blk/internal/statefile"
	"github.com/iser-blk/iser-blk/internal/status"
	"github.com/iser-blk/iser-blk/internal/takeover"
)

func memDevice(t *testing.T, size int64) block.Device { return memdevtest.New(t, size) }

// fakeProcess is Process for tests: exec and exit are recorded, never done.
type fakeProcess struct {
	executable string
	mu         sync.Mutex
	execs      []string
	envs       [][]string // each exec's environment
	exits      []int
	ignored    atomic.Bool
	execErr    error
	onIgnore   func()
}

func (p *fakeProcess) process(t *testing.T) Process {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p.executable = self
	return Process{
		Executable: self,
		Exec: func(path string, env []string) error {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.execs = append(p.execs, path)
			p.envs = append(p.envs, env)
			return p.execErr
		},
		Exit: func(code int) {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.exits = append(p.exits, code)
		},
		IgnoreStopSignals: func() {
			p.ignored.Store(true)
			if p.onIgnore != nil {
				p.onIgnore()
			}
		},
	}
}

// fixture is a gateway named gw serving dev, with the lifecycle at ready; with a takeover (as
// attach --name sets it up) dev is served through its gate and the gateway can hand it over.
type fixture struct {
	g      *Gateway
	paths  func(serving bool, reason string) // the backend's availability reports (WatchAvailability)
	tk     *takeover.Takeover                // nil without a hand-over
	dev    block.Device                      // the stack
	proc   *fakeProcess
	stops  atomic.Int32 // StopFrontend calls
	onStop func()       // run by StopFrontend (nil: nothing)
}

type fixtureOptions struct {
	kind      modes.Frontend // ublk (default), nbd, nbd-socket
	handOver  bool
	cacheMode modes.Cache // of the takeover (zero: write-back)
	prev      *statefile.State
	log       *zap.Logger // nil: the test's
}

// watched is the stack as the backend reports its availability: the gateway subscribes in
// Serving, and the test calls fixture.paths.
type watched struct {
	block.Device
	f *fixture
}

func (w *watched) WatchAvailability(fn func(serving bool, reason string)) { w.f.paths = fn }

func newFixture(t *testing.T, dev block.Device, fo fixtureOptions) *fixture {
	t.Helper()
	if fo.kind == "" {
		fo.kind = modes.Ublk
	}
	dir := t.TempDir()
	f := &fixture{dev: dev, proc: &fakeProcess{}}
	log := fo.log
	if log == nil {
		log = zaptest.NewLogger(t)
	}
	g, err := Start(Options{
		Service:  service.Options{RunDir: dir, Identity: status.Identity{Name: "gw", FrontendKind: fo.kind}},
		Counters: new(status.IOCounters),
		StopFrontend: func() {
			f.stops.Add(1)
			if f.onStop != nil {
				f.onStop()
			}
		},
		Log:     log,
		Process: f.proc.process(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	f.g = g
	t.Cleanup(func() { _ = g.Service().Close() })
	if fo.handOver {
		if fo.prev != nil {
			st := *fo.prev
			st.Version, st.Name, st.Kind = statefile.Version, "gw", modes.Ublk
			st.LUN = statefile.Identity{Target: "iscsi://192.0.2.1/iqn.2026-01.test:t1/1", Size: dev.Size(), BlockSize: dev.BlockSize()}
			if err := statefile.Write(statefile.Path(dir, "gw"), st); err != nil {
				t.Fatal(err)
			}
		}
		tk, err := takeover.Prepare(takeover.Options{Dir: dir, Name: "gw", Kind: modes.Ublk, CacheMode: fo.cacheMode,
			LUN: statefile.Identity{Target: "iscsi://192.0.2.1/iqn.2026-01.test:t1/1", Size: dev.Size(), BlockSize: dev.BlockSize()}})
		if err != nil {
			t.Fatal(err)
		}
		tk.Serving(dev) // the frontend's device; tests reach it through f.tk.Gate()
		if err := tk.Record(modes.Ublk, 3); err != nil {
			t.Fatal(err)
		}
		tk.SetCanWait(func() error { return nil })
		f.tk = tk
	}
	g.Serving(&watched{Device: dev, f: f}, "", status.Frontend{Kind: fo.kind})
	g.Ready()
	if f.tk != nil && !g.CanHandOver(f.tk) {
		t.Fatal("CanHandOver refused on a serving gateway")
	}
	return f
}

func (f *fixture) state(t *testing.T) statefile.State {
	t.Helper()
	st, err := statefile.Read(f.tk.Path())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func wantControlError(t *testing.T, err error, code, contains string) {
	t.Helper()
	var ce *control.Error
	if !errors.As(err, &ce) || ce.Code != code || !strings.Contains(ce.Message, contains) {
		t.Fatalf("got %v; want a %q error saying %q", err, code, contains)
	}
}

func wantState(t *testing.T, g *Gateway, state lifecycle.State, reason string) {
	t.Helper()
	if s, r := g.State(); s != state || (reason != "" && !strings.Contains(r, reason)) {
		t.Fatalf("state %s (%q), want %s (%q)", s, r, state, reason)
	}
}

// flushHook is a device whose write-back runs hook first and fails when hook returns an error.
type flushHook struct {
	block.Device
	hook func(ctx context.Context) error
}

func (d flushHook) Flush(ctx context.Context) error {
	if err := d.hook(ctx); err != nil {
		return err
	}
	return d.Device.Flush(ctx)
}

// blockedFlush is a device whose first write-back says it began and then waits for its
// context; every later one fails at once (a target that went away).
type blockedFlush struct {
	block.Device
	once  *sync.Once
	began chan struct{}
}

func (d blockedFlush) Flush(ctx context.Context) error {
	first := false
	d.once.Do(func() { first = true; close(d.began) })
	if !first {
		return block.ErrIO
	}
	<-ctx.Done()
	return ctx.Err()
}

func newBlockedFlush(t *testing.T) blockedFlush {
	return blockedFlush{Device: memDevice(t, 1<<20), once: new(sync.Once), began: make(chan struct{})}
}

// linkTo makes dir/name a symbolic link to target.
func linkTo(t *testing.T, dir, name, target string) string {
	t.Helper()
	link := filepath.Join(dir, name)
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	return link
}
