package csi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"
)

// fakeBus is systemd's manager as the launcher sees it: each StartTransientUnit answers with
// the next of results ("" or a job result; an error instead when errs has one for the call).
type fakeBus struct {
	mu      sync.Mutex
	calls   []fakeStart
	errs    []error  // StartTransientUnit's error per call (nil: the job runs)
	results []string // the job's result per successful call ("": "done")
	resets  []string
	closed  bool
}

type fakeStart struct {
	unit, mode string
	props      []sddbus.Property
}

func (b *fakeBus) StartTransientUnitContext(_ context.Context, name, mode string, props []sddbus.Property, ch chan<- string) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.calls)
	b.calls = append(b.calls, fakeStart{name, mode, props})
	if n < len(b.errs) && b.errs[n] != nil {
		return 0, b.errs[n]
	}
	res := "done"
	if n < len(b.results) && b.results[n] != "" {
		res = b.results[n]
	}
	go func() { ch <- res }() // systemd's JobRemoved signal comes after the call's reply
	return n + 1, nil
}

func (b *fakeBus) ResetFailedUnitContext(_ context.Context, name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.resets = append(b.resets, name)
	return nil
}

func (b *fakeBus) Close() { b.mu.Lock(); b.closed = true; b.mu.Unlock() }

// dialer is a dial function that connects to bus.
func dialer(bus *fakeBus) func(context.Context) (systemdBus, error) {
	return func(context.Context) (systemdBus, error) { return bus, nil }
}

var unitExists = godbus.Error{Name: "org.freedesktop.systemd1.UnitExists", Body: []any{"Unit iser-blk-csi-x.scope already exists."}}

// TestLauncherChoice: process never asks systemd; systemd-scope requires it; auto falls back to
// process when systemd does not answer and says so in one warning, at the first gateway it
// places, and uses systemd when it answers.
func TestLauncherChoice(t *testing.T) {
	ctx := context.Background()
	down := errors.New("dial unix /run/systemd/private: connect: no such file or directory")
	for _, tt := range []struct {
		mode     LaunchMode
		dialErr  error
		want     LaunchMode // "": an error
		dials    int
		warnings int
	}{
		{LaunchProcess, nil, LaunchProcess, 0, 0},
		{"", nil, LaunchProcess, 0, 0},
		{LaunchSystemdScope, nil, LaunchSystemdScope, 1, 0},
		{LaunchSystemdScope, down, "", 1, 0},
		{LaunchAuto, nil, LaunchSystemdScope, 1, 0},
		{LaunchAuto, down, LaunchProcess, 1, 1},
		{"fork", nil, "", 0, 0},
	} {
		core, logs := observer.New(zapcore.WarnLevel)
		dials := 0
		dial := func(context.Context) (systemdBus, error) {
			dials++
			if tt.dialErr != nil {
				return nil, tt.dialErr
			}
			return &fakeBus{}, nil
		}
		l, err := newLauncher(ctx, tt.mode, dial, zap.New(core))
		probes := dials
		switch {
		case tt.want == "" && err == nil:
			t.Errorf("%q (dial error %v): launcher %s, want an error", tt.mode, tt.dialErr, l.Mode())
		case tt.want != "" && err != nil:
			t.Errorf("%q (dial error %v): %v", tt.mode, tt.dialErr, err)
		case tt.want != "" && l.Mode() != tt.want:
			t.Errorf("%q (dial error %v): launcher %s, want %s", tt.mode, tt.dialErr, l.Mode(), tt.want)
		}
		if tt.mode == LaunchSystemdScope && err != nil && !strings.Contains(err.Error(), "no such file") {
			t.Errorf("systemd-scope's error does not say why: %v", err)
		}
		if err == nil {
			for range 2 {
				if err := l.Place(ctx, "csi-00000000000000aa", os.Getpid()); err != nil && l.Mode() == LaunchProcess {
					t.Errorf("%q: process launcher's place: %v", tt.mode, err)
				}
			}
		}
		if probes != tt.dials || logs.Len() != tt.warnings {
			t.Errorf("%q (dial error %v): %d dials, %d warnings; want %d, %d", tt.mode, tt.dialErr, probes, logs.Len(), tt.dials, tt.warnings)
		}
		// systemd is asked afresh for each gateway: a connection kept would not survive its re-exec
		if want := probes + 2; err == nil && l.Mode() == LaunchSystemdScope && dials != want {
			t.Errorf("%q: %d dials after two gateways, want %d", tt.mode, dials, want)
		}
		if tt.warnings > 0 && !strings.Contains(logs.All()[0].Message, "die") {
			t.Errorf("the fallback's warning does not say what it costs: %q", logs.All()[0].Message)
		}
	}
	for _, s := range []string{"auto", "process", "systemd-scope"} {
		if m, err := ParseLaunchMode(s); err != nil || string(m) != s {
			t.Errorf("ParseLaunchMode(%q) = %q, %v", s, m, err)
		}
	}
	if _, err := ParseLaunchMode("systemd"); err == nil {
		t.Error("ParseLaunchMode(systemd) accepted")
	}
}

// propMap is props by name, their values as Go values.
func propMap(props []sddbus.Property) map[string]any {
	m := map[string]any{}
	for _, p := range props {
		m[p.Name] = p.Value.Value()
	}
	return m
}

// TestScopeLauncherProperties: the gateway's PID goes into iser-blk-NAME.scope, started with
// mode fail, in system.slice, collected even when it fails, stopped like iser-blk@.service
// (SIGTERM to the gateway alone, 10 minutes for its write-back, before the network goes down).
func TestScopeLauncherProperties(t *testing.T) {
	bus := &fakeBus{}
	l := &scopeLauncher{dial: dialer(bus), cgroupOf: func(pid int) (string, error) { return "iser-blk-csi-00000000000000aa.scope", nil }}
	if err := l.Place(context.Background(), "csi-00000000000000aa", 4242); err != nil {
		t.Fatal(err)
	}
	if len(bus.calls) != 1 || bus.calls[0].unit != "iser-blk-csi-00000000000000aa.scope" || bus.calls[0].mode != "fail" {
		t.Fatalf("calls %+v", bus.calls)
	}
	got := propMap(bus.calls[0].props)
	want := map[string]any{
		"Description":     "iser-blk gateway csi-00000000000000aa of the CSI plugin",
		"PIDs":            []uint32{4242},
		"Slice":           "system.slice",
		"CollectMode":     "inactive-or-failed",
		"KillMode":        "control-group",
		"TimeoutStopUSec": uint64(600_000_000),
		"After":           []string{"network.target", "network-online.target"},
		"Before":          []string{"remote-fs-pre.target"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("scope properties\n got %#v\nwant %#v", got, want)
	}
	if !bus.closed {
		t.Error("the connection to systemd is left open after the move")
	}
}

// TestScopeLauncherFailures: a lingering scope of the same name is waited for (reset, retried);
// one that stays is an error naming it; a failed job, a refused call and a PID that did not
// land in the scope are errors; a gateway that exited before the check is not (ExecGateways
// reports its exit).
func TestScopeLauncherFailures(t *testing.T) {
	ctx := context.Background()
	const name, unit = "csi-00000000000000bb", "iser-blk-csi-00000000000000bb.scope"
	inScope := func(int) (string, error) { return unit, nil }

	bus := &fakeBus{errs: []error{unitExists, unitExists}}
	l := &scopeLauncher{dial: dialer(bus), cgroupOf: inScope, poll: time.Millisecond}
	if err := l.Place(ctx, name, 7); err != nil || len(bus.calls) != 3 || len(bus.resets) != 2 || bus.resets[0] != unit {
		t.Errorf("lingering scope: %v after %d calls, resets %q", err, len(bus.calls), bus.resets)
	}

	for _, tt := range []struct {
		what     string
		bus      *fakeBus
		cgroupOf func(int) (string, error)
		want     string // "" no error
	}{
		{"job failed", &fakeBus{results: []string{"failed"}}, inScope, `ended "failed"`},
		{"refused", &fakeBus{errs: []error{godbus.Error{Name: "org.freedesktop.DBus.Error.AccessDenied"}}}, inScope, unit},
		{"elsewhere", &fakeBus{}, func(int) (string, error) { return "cri-containerd-0123.scope", nil }, "hostPID"},
		{"exited", &fakeBus{}, func(int) (string, error) {
			return "", &fs.PathError{Op: "open", Path: "/proc/7/cgroup", Err: fs.ErrNotExist}
		}, ""},
		{"bad name", &fakeBus{}, inScope, "no systemd unit name"},
		{"systemd gone", nil, inScope, "connection refused"},
	} {
		l := &scopeLauncher{dial: dialer(tt.bus), cgroupOf: tt.cgroupOf}
		if tt.bus == nil {
			l.dial = func(context.Context) (systemdBus, error) {
				return nil, errors.New("dial unix /run/systemd/private: connect: connection refused")
			}
		}
		n := name
		if tt.what == "bad name" {
			n = "csi x"
		}
		err := l.Place(ctx, n, 7)
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%s: %v, want %q", tt.what, err, tt.want)
		}
	}

	// a scope that stays is reported once scopeExistsWait is over; ctx ends the wait earlier
	bus = &fakeBus{errs: []error{unitExists, unitExists, unitExists, unitExists, unitExists, unitExists, unitExists, unitExists}}
	l = &scopeLauncher{dial: dialer(bus), cgroupOf: inScope, poll: time.Millisecond}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := l.Place(short, name, 7); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("lingering scope past ctx: %v", err)
	}
}

// TestLastCgroup: the unit is the last element of the process's systemd cgroup, seen from the
// host, from a private cgroup namespace, or on a hybrid v1 host.
func TestLastCgroup(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"0::/system.slice/iser-blk-csi-1.scope\n", "iser-blk-csi-1.scope"},
		{"0::/../../../system.slice/iser-blk-csi-1.scope\n", "iser-blk-csi-1.scope"},
		{"12:memory:/kubepods/x\n1:name=systemd:/system.slice/iser-blk-csi-1.scope\n0::/\n", "iser-blk-csi-1.scope"},
		{"0::/\n", ""},
	} {
		got, err := lastCgroup(strings.NewReader(tt.in))
		if err != nil || got != tt.want {
			t.Errorf("%q: %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	if _, err := lastCgroup(strings.NewReader("garbage\n")); err == nil {
		t.Error("no cgroup line accepted")
	}
	if _, err := procCgroup(os.Getpid()); err != nil {
		t.Errorf("this process's cgroup: %v", err)
	}
}

// failingLauncher refuses every gateway and remembers its PID.
type failingLauncher struct{ pid int }

func (f *failingLauncher) Place(_ context.Context, _ string, pid int) error {
	f.pid = pid
	return errors.New("systemd said no")
}
func (f *failingLauncher) Mode() LaunchMode { return LaunchSystemdScope }

// TestExecGatewaysUnplaced: a gateway its launcher could not place is killed (and reaped) and
// the start fails with the launcher's reason and the log's path; one placed serves as usual.
func TestExecGatewaysUnplaced(t *testing.T) {
	runDir := filepath.Join(t.TempDir(), "run")
	fl := &failingLauncher{}
	g := &ExecGateways{Binary: os.Args[0], RunDir: runDir, Log: zap.NewNop(), HasUblk: func() bool { return true },
		Poll: 10 * time.Millisecond, Launcher: fl}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t.Setenv(gatewayEnv, "serve")
	spec := GatewaySpec{Name: "csi-00000000000000cc", Targets: []string{testTargetNorm}}
	_, err := g.Ensure(ctx, spec)
	if err == nil || !strings.Contains(err.Error(), "systemd said no") || !strings.Contains(err.Error(), RecordsIn(runDir).LogFile(spec.Name)) {
		t.Errorf("ensure with a failing launcher: %v", err)
	}
	if fl.pid == 0 {
		t.Fatal("the launcher was not asked")
	}
	if err := unix.Kill(fl.pid, 0); !errors.Is(err, unix.ESRCH) {
		t.Errorf("unplaced gateway PID %d: %v, want gone", fl.pid, err)
	}

	var placed []string
	g.Launcher = placeFunc(func(name string, pid int) error { placed = append(placed, fmt.Sprint(name, pid)); return nil })
	st, err := g.Ensure(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprint(spec.Name, st.Gateway.PID); len(placed) != 1 || placed[0] != want {
		t.Errorf("placed %q, want [%s]", placed, want)
	}
	if err := g.Detach(ctx, spec.Name); err != nil {
		t.Fatal(err)
	}
}

type placeFunc func(name string, pid int) error

func (f placeFunc) Place(_ context.Context, name string, pid int) error { return f(name, pid) }
func (placeFunc) Mode() LaunchMode                                      { return LaunchSystemdScope }
