package csi

import (
	"context"
	"fmt"
	"sync"

	"go.uber.org/zap"
)

// A Launcher decides where a gateway process lives once ExecGateways has started it: in the
// plugin's own cgroup (LaunchProcess), or in a transient scope unit of the host's systemd
// (LaunchSystemdScope, launch_systemd.go).
//
// Why it matters: in Kubernetes the plugin runs in a container with hostPID: true, and when the
// container stops (a restart, an upgrade, a liveness failure) the runtime kills every process in
// the container's cgroup, not only the plugin. A gateway left there dies with the plugin, and a
// device with dirty write-back data is then fenced (ceph-csi's rbd-nbd had exactly this,
// ceph-csi#2204). A gateway moved into a scope of its own is no longer in that cgroup: the
// container's end does not touch it, and the restarted plugin adopts it (Node.Heal). It stays in
// the plugin's mount and network namespaces (it was started there), so it sees the same /dev,
// /run/iser-blk and binary it was started with — Kubernetes' mount-utils does the same for FUSE
// daemons with `systemd-run --scope`.
type Launcher interface {
	// Place is called right after the gateway name's process pid has started, before it serves.
	// An error means it is not where it must live: ExecGateways then kills it (SIGKILL, as if
	// the plugin had died at that moment) and fails the start, which the CO or healer retries.
	Place(ctx context.Context, name string, pid int) error
	// Mode is the mode the launcher implements (for the log).
	Mode() LaunchMode
}

// LaunchMode is the choice of `iser-blk csi --launcher`.
type LaunchMode string

const (
	// LaunchAuto is LaunchSystemdScope when the host's systemd answers (launch_systemd.go:
	// dialSystemd), else LaunchProcess with a warning logged once.
	LaunchAuto LaunchMode = "auto"
	// LaunchProcess leaves the gateway in the plugin's cgroup: it survives the plugin's exit or
	// kill -9, not the end of a container whose runtime kills the whole cgroup. Right where the
	// plugin runs as a host service or a process (and for the tests).
	LaunchProcess LaunchMode = "process"
	// LaunchSystemdScope moves the gateway into a transient scope unit of the host's systemd,
	// iser-blk-NAME.scope, out of the plugin's cgroup.
	LaunchSystemdScope LaunchMode = "systemd-scope"
)

// LaunchModes are the valid modes, for the flag's help and check.
var LaunchModes = []LaunchMode{LaunchAuto, LaunchProcess, LaunchSystemdScope}

// ParseLaunchMode checks s against LaunchModes.
func ParseLaunchMode(s string) (LaunchMode, error) {
	for _, m := range LaunchModes {
		if string(m) == s {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown launcher %q (want auto, process or systemd-scope)", s)
}

// processLauncher leaves the gateway where it was started.
type processLauncher struct{}

func (processLauncher) Place(context.Context, string, int) error { return nil }
func (processLauncher) Mode() LaunchMode                         { return LaunchProcess }

// NewLauncher returns mode's launcher. LaunchSystemdScope fails when the host's systemd cannot be
// reached or cannot be told which process to move; LaunchAuto then falls back to LaunchProcess
// and warns once, at the first gateway it starts.
func NewLauncher(ctx context.Context, mode LaunchMode, log *zap.Logger) (Launcher, error) {
	return newLauncher(ctx, mode, dialSystemd, log)
}

func newLauncher(ctx context.Context, mode LaunchMode, dial func(context.Context) (systemdBus, error), log *zap.Logger) (Launcher, error) {
	switch mode {
	case LaunchProcess, "":
		return processLauncher{}, nil
	case LaunchSystemdScope, LaunchAuto:
	default:
		return nil, fmt.Errorf("unknown launcher %q", mode)
	}
	bus, err := dial(ctx) // a probe: each Place connects afresh (launch_systemd.go says why)
	if err == nil {
		bus.Close()
		return &scopeLauncher{dial: dial, cgroupOf: procCgroup}, nil
	}
	if mode == LaunchSystemdScope {
		return nil, fmt.Errorf("launcher systemd-scope: %w", err)
	}
	log.Info("launcher auto: gateways will be plain processes, the host's systemd does not answer", zap.Error(err))
	return &fallbackLauncher{log: log, why: err}, nil
}

// fallbackLauncher is LaunchAuto without systemd: LaunchProcess, with a warning at the first
// gateway it starts (a plugin that starts none, the controller, has nothing to warn about).
type fallbackLauncher struct {
	processLauncher
	once sync.Once
	log  *zap.Logger
	why  error
}

func (f *fallbackLauncher) Place(context.Context, string, int) error {
	f.once.Do(func() {
		f.log.Warn("gateways are started as plain processes in the plugin's cgroup: they die when a container runtime kills it "+
			"(a container restart or upgrade), and their devices with them; give the plugin the host's /run/systemd "+
			"for systemd scopes (docs/kubernetes.md)", zap.String("launcher", string(LaunchProcess)), zap.Error(f.why))
	})
	return nil
}
