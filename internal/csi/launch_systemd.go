package csi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"regexp"
	"strings"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// The systemd-scope launcher: the gateway, already started by ExecGateways, is moved into a
// transient scope unit iser-blk-NAME.scope of the host's systemd (StartTransientUnit with its
// PID), so that it leaves the plugin's container cgroup. Why a scope and not a service: a scope
// adopts a process that runs already, in the namespaces it was started in (the plugin's mount
// namespace: same binary, same /dev and run directory), with the plugin as its parent; a service
// would be started by systemd in the host's namespaces, from a binary the host may not have.
//
// The window: between the process's start and the end of the move the gateway is still in the
// plugin's cgroup, and a container killed in that window (milliseconds: one D-Bus round trip)
// takes it along. That is accepted, rather than starting through `systemd-run --scope` (which
// moves itself before it execs the gateway, so there is no window, but needs systemd-run in the
// image, of a version that talks to the host's systemd, and reports a failed move only as an
// exit status). Nothing is lost in the window: a gateway that has just started has served no
// I/O (NodeStage has not returned, so nothing is mounted on its device yet), and one the healer
// started to take over a waiting device dies like any gateway killed mid-takeover — the device
// keeps waiting with its state file, and the next plugin's healer starts it again. A failed move
// is treated the same way: ExecGateways kills the gateway with SIGKILL (not SIGTERM, which would
// detach, i.e. remove, a device it is taking over) and the start fails for the CO to retry.
//
// The scope's properties (scopeProperties):
//   - Slice=system.slice, explicitly: the host's services' slice, not the kubelet's pod slices,
//     which a runtime tears down with the pod.
//   - CollectMode=inactive-or-failed: a gateway that exits with an error leaves no failed unit
//     behind to hold the name against its successor.
//   - KillMode=control-group and TimeoutStopSec=10min, as iser-blk@.service: stopping the scope
//     (systemctl stop, the host's shutdown) sends the gateway SIGTERM, its detach (drain, write
//     back, remove the device), and gives the write-back as long as the service does before
//     SIGKILL. The scope holds the gateway alone: nothing else is signalled.
//   - After=network.target network-online.target, Before=remote-fs-pre.target, as the service: at
//     shutdown the gateway is stopped after remote filesystems are unmounted and before the
//     network goes down, so its write-back can reach the target.

// systemdBus is the part of go-systemd's *dbus.Conn the launcher uses (a fake in the tests).
type systemdBus interface {
	StartTransientUnitContext(ctx context.Context, name, mode string, props []sddbus.Property, ch chan<- string) (int, error)
	ResetFailedUnitContext(ctx context.Context, name string) error
	Close()
}

// scopeStopTimeout is the scope's TimeoutStopSec: iser-blk@.service's.
const scopeStopTimeout = 10 * time.Minute

// scopeExistsWait bounds the wait for a previous gateway's scope of the same name to be
// collected: systemd removes an emptied scope asynchronously, shortly after its process exits.
const scopeExistsWait = 10 * time.Second

// unitNameChars are the characters a gateway name may have to make a unit name (control's
// names are a subset; a unit name allows more).
var unitNameChars = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// ScopeUnit is the scope unit of gateway name: iser-blk-NAME.scope (the CSI plugin's names
// are csi-HASH, so iser-blk-csi-HASH.scope).
func ScopeUnit(name string) (string, error) {
	unit := "iser-blk-" + name + ".scope"
	if !unitNameChars.MatchString(name) || len(unit) > 255 {
		return "", fmt.Errorf("gateway name %q makes no systemd unit name", name)
	}
	return unit, nil
}

// scopeProperties are the properties of gateway name's scope holding pid (see above for why).
func scopeProperties(name string, pid int) []sddbus.Property {
	return []sddbus.Property{
		sddbus.PropDescription("iser-blk gateway " + name + " of the CSI plugin"),
		sddbus.PropPids(uint32(pid)),
		sddbus.PropSlice("system.slice"),
		{Name: "CollectMode", Value: godbus.MakeVariant("inactive-or-failed")},
		{Name: "KillMode", Value: godbus.MakeVariant("control-group")},
		{Name: "TimeoutStopUSec", Value: godbus.MakeVariant(uint64(scopeStopTimeout / time.Microsecond))},
		sddbus.PropAfter("network.target", "network-online.target"),
		sddbus.PropBefore("remote-fs-pre.target"),
	}
}

// dialSystemd connects to the host's systemd: its private socket /run/systemd/private first
// (systemd itself, root only, no dbus-daemon needed: what systemctl uses as root), then the
// system bus. It fails unless PID 1 of this PID namespace is systemd: systemd takes the PIDs
// in StartTransientUnit as its own namespace's, so a plugin that does not share the host's
// PID namespace would name some other process.
func dialSystemd(ctx context.Context) (systemdBus, error) {
	comm, err := os.ReadFile("/proc/1/comm")
	if err != nil {
		return nil, fmt.Errorf("PID 1: %w", err)
	}
	if c := strings.TrimSpace(string(comm)); c != "systemd" {
		return nil, fmt.Errorf("PID 1 is %q, not systemd: the plugin does not share the host's PID namespace (hostPID) or the host runs no systemd", c)
	}
	conn, err := sddbus.NewSystemdConnectionContext(ctx)
	if err != nil {
		var err2 error
		if conn, err2 = sddbus.NewSystemConnectionContext(ctx); err2 != nil {
			return nil, fmt.Errorf("the host's systemd is not reachable at /run/systemd/private (%v) nor over the system bus (%v)", err, err2)
		}
	}
	// a socket that accepts is not yet a systemd that answers
	if _, err := conn.GetManagerProperty("Version"); err != nil {
		conn.Close()
		return nil, fmt.Errorf("the host's systemd does not answer: %w", err)
	}
	return conn, nil
}

// scopeLauncher is LaunchSystemdScope. It connects to systemd for each Place and closes the
// connection after: starts are rare, and a connection kept for the plugin's lifetime would be
// cut by the host's `systemctl daemon-reexec` (a systemd upgrade) and fail every later start.
type scopeLauncher struct {
	dial     func(context.Context) (systemdBus, error) // dialSystemd
	cgroupOf func(pid int) (string, error)             // procCgroup
	poll     time.Duration                             // first wait for a lingering scope (0: 20ms)
}

func (l *scopeLauncher) Mode() LaunchMode { return LaunchSystemdScope }

// Place implements Launcher: it returns once systemd has started the scope with pid in it and
// /proc says so.
func (l *scopeLauncher) Place(ctx context.Context, name string, pid int) error {
	unit, err := ScopeUnit(name)
	if err != nil {
		return err
	}
	bus, err := l.dial(ctx)
	if err != nil {
		return fmt.Errorf("scope %s: %w", unit, err)
	}
	defer bus.Close()
	props := scopeProperties(name, pid)
	poll := l.poll
	if poll <= 0 {
		poll = 20 * time.Millisecond
	}
	deadline := time.Now().Add(scopeExistsWait)
	for {
		err = start(ctx, bus, unit, props)
		if !isUnitExists(err) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("scope %s: still there after %v: a previous gateway %s still runs in it (systemctl status %s)",
				unit, scopeExistsWait, name, unit)
		}
		// the scope of a previous gateway of this name, not collected yet (a failed one
		// would wait for a reset: do it)
		_ = bus.ResetFailedUnitContext(ctx, unit)
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("scope %s: %w", unit, ctx.Err())
		case <-t.C:
		}
		poll = min(2*poll, 500*time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("scope %s: %w", unit, err)
	}
	cg, err := l.cgroupOf(pid)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // it exited already: ExecGateways reports that with its log
	}
	if err != nil {
		return fmt.Errorf("scope %s: %w", unit, err)
	}
	if cg != unit {
		return fmt.Errorf("scope %s started, but gateway PID %d is in cgroup %s: systemd and this plugin do not see the same PIDs (hostPID)", unit, pid, cg)
	}
	return nil
}

// start starts unit and waits for the job's end.
func start(ctx context.Context, bus systemdBus, unit string, props []sddbus.Property) error {
	done := make(chan string, 1)
	if _, err := bus.StartTransientUnitContext(ctx, unit, "fail", props, done); err != nil {
		return err
	}
	select {
	case res := <-done:
		if res != "done" {
			return fmt.Errorf("systemd's start job ended %q", res)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// isUnitExists reports whether err is systemd's refusal of a transient unit whose name is taken.
func isUnitExists(err error) bool {
	var de godbus.Error
	return errors.As(err, &de) && de.Name == "org.freedesktop.systemd1.UnitExists"
}

// procCgroup is the last element of pid's cgroup v2 path in /proc/PID/cgroup (on a v1 or
// hybrid host, of systemd's name=systemd hierarchy): the unit that holds it.
func procCgroup(pid int) (string, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", err
	}
	defer f.Close()
	return lastCgroup(f)
}

// lastCgroup reads /proc/PID/cgroup's format (see procCgroup).
func lastCgroup(f io.Reader) (string, error) {
	var v2, v1 string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		id, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		ctrl, path, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		switch {
		case id == "0" && ctrl == "":
			v2 = path
		case ctrl == "name=systemd":
			v1 = path
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	path := v1 // on a hybrid host the v2 line is not systemd's tree of units
	if path == "" {
		path = v2
	}
	if path == "" {
		return "", errors.New("no systemd cgroup in /proc/PID/cgroup")
	}
	return path[strings.LastIndexByte(path, '/')+1:], nil
}
