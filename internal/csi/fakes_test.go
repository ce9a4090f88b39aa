package csi

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/modes"
	gwstatus "github.com/iser-blk/iser-blk/internal/status"
)

// fakeGateways is Gateways without processes: a started gateway serves /dev/ublkbN at once,
// and its "state file" (waiting) lasts until it is detached, as a real one's does.
type fakeGateways struct {
	mu       sync.Mutex
	running  map[string]gwstatus.Status
	waiting  map[string]bool
	specs    map[string]GatewaySpec // the last spec each name was started with
	starts   map[string]int
	detaches map[string]int
	nextDev  int

	state      string // the state a started gateway reports ("": ready)
	fenced     bool
	ensureErr  error
	detachErr  error
	inEnsure   chan struct{} // when set, Ensure sends on it, then waits for release
	release    chan struct{}
	statusHook func(name string) (gwstatus.Status, bool, error) // overrides Status when ok
}

func newFakeGateways() *fakeGateways {
	return &fakeGateways{running: map[string]gwstatus.Status{}, waiting: map[string]bool{},
		specs: map[string]GatewaySpec{}, starts: map[string]int{}, detaches: map[string]int{}}
}

func (f *fakeGateways) Ensure(ctx context.Context, spec GatewaySpec) (gwstatus.Status, error) {
	if f.inEnsure != nil {
		f.inEnsure <- struct{}{}
		select {
		case <-f.release:
		case <-ctx.Done():
			return gwstatus.Status{}, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if st, ok := f.running[spec.Name]; ok {
		return st, nil
	}
	if f.ensureErr != nil {
		return gwstatus.Status{}, f.ensureErr
	}
	f.starts[spec.Name]++
	f.specs[spec.Name] = spec
	state := f.state
	if state == "" {
		state = "ready"
	}
	st := gwstatus.Status{Version: gwstatus.Version,
		Gateway: gwstatus.Gateway{Name: spec.Name, State: state, Fenced: f.fenced, FrontendKind: modes.Ublk,
			FrontendPath: fmt.Sprintf("/dev/ublkb%d", f.nextDev), Targets: spec.Targets},
		LUN: &gwstatus.LUN{SizeBytes: 1 << 30, BlockSize: 512}}
	if f.fenced {
		st.Gateway.State, st.Gateway.StateReason = "failed", gwstatus.FencedReason+"acknowledged writes may be lost"
	}
	f.nextDev++
	f.running[spec.Name] = st
	f.waiting[spec.Name] = true
	return st, nil
}

func (f *fakeGateways) Status(_ context.Context, name string) (gwstatus.Status, error) {
	if f.statusHook != nil {
		if st, ok, err := f.statusHook(name); ok {
			return st, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if st, ok := f.running[name]; ok {
		return st, nil
	}
	return gwstatus.Status{}, fmt.Errorf("%w: %q", control.ErrUnknownGateway, name)
}

func (f *fakeGateways) Detach(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.detachErr != nil {
		return f.detachErr
	}
	if _, ok := f.running[name]; !ok {
		return nil
	}
	f.detaches[name]++
	delete(f.running, name)
	delete(f.waiting, name)
	return nil
}

func (f *fakeGateways) Waiting(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.waiting[name]
}

// kill is a gateway's death: the device (and its state file) stays.
func (f *fakeGateways) kill(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.running, name)
}

func (f *fakeGateways) count(m map[string]int, name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return m[name]
}

// fakeMounter keeps a mount table and the filesystems of devices in memory. Like the kernel it
// refuses to unmount what is not mounted, to mount over a mount point twice, and to bind a
// source that is not there.
type fakeMounter struct {
	mu      sync.Mutex
	mounts  map[string]string // target → source
	ro      map[string]bool
	options map[string][]string
	fs      map[string]string // device → filesystem
	parted  map[string]bool
	formats map[string]int
}

func newFakeMounter() *fakeMounter {
	return &fakeMounter{mounts: map[string]string{}, ro: map[string]bool{}, options: map[string][]string{},
		fs: map[string]string{}, parted: map[string]bool{}, formats: map[string]int{}}
}

func (m *fakeMounter) Mounted(path string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.mounts[path]
	return ok, nil
}

func (m *fakeMounter) Probe(_ context.Context, device string) (string, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.fs[device], m.parted[device], nil
}

func (m *fakeMounter) Format(_ context.Context, device, fsType string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fs[device] != "" {
		return fmt.Errorf("fake mkfs: %s already holds %s", device, m.fs[device])
	}
	m.fs[device] = fsType
	m.formats[device]++
	return nil
}

func (m *fakeMounter) mount(source, target string, ro bool, options []string) error {
	if _, ok := m.mounts[target]; ok {
		return fmt.Errorf("fake mount: %s is mounted already", target)
	}
	if _, err := os.Stat(target); err != nil {
		return fmt.Errorf("fake mount: %w", err)
	}
	m.mounts[target], m.ro[target], m.options[target] = source, ro, options
	return nil
}

func (m *fakeMounter) Mount(_ context.Context, device, target, fsType string, options []string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fs[device] != fsType {
		return fmt.Errorf("fake mount: %s holds %q, not %s", device, m.fs[device], fsType)
	}
	return m.mount(device, target, slices.Contains(options, "ro"), options)
}

func (m *fakeMounter) Bind(_ context.Context, source, target string, readOnly bool, options []string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, staged := m.mounts[source]; !staged && m.fs[source] == "" && !isDevice(source) {
		return fmt.Errorf("fake bind: %s is neither a mount point nor a device", source)
	}
	return m.mount(source, target, readOnly, options)
}

func isDevice(p string) bool { return len(p) > 5 && p[:5] == "/dev/" }

func (m *fakeMounter) Unmount(target string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.mounts[target]; !ok {
		return fmt.Errorf("unmount %s: %w", target, unix.EINVAL)
	}
	delete(m.mounts, target)
	return nil
}

func (m *fakeMounter) mounted() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.mounts)
}
