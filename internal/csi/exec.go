package csi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/internal/chapcreds"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/statefile"
	"github.com/iser-blk/iser-blk/internal/status"
)

// ublkControl is the ublk driver's control device: where it exists, FrontendAuto is ublk.
const ublkControl = "/dev/ublk-control"

// ExecGateways starts each gateway as its own `iser-blk attach` process and talks to it through
// its control socket. The process is in a new session (Setsid), so no signal to the plugin's
// process group — a Ctrl-C, a kill of the plugin's group — reaches it, and nothing ties it to
// the plugin: no pipe (a write to a pipe whose reader died would kill it with SIGPIPE), no
// parent-death signal. Its stdin is /dev/null and its stdout and stderr go to
// RUNDIR/csi/NAME.log.
type ExecGateways struct {
	Binary string // the iser-blk executable (os.Executable of the plugin)
	RunDir string // the gateways' --run-dir
	Log    *zap.Logger
	// Memory is every gateway's buffer pool and cache size (the zero value: attach's defaults).
	Memory MemoryShare
	// HasUblk reports whether the kernel has ublk (nil: /dev/ublk-control exists).
	HasUblk func() bool
	// Poll is the first interval between status queries while a gateway starts (0: 50ms); it
	// doubles up to 1s. The gateway's control socket is the one readiness signal that also
	// works for a gateway this process did not start.
	Poll time.Duration
	// Launcher places each gateway once started (launch.go; nil: it stays in the plugin's
	// cgroup, LaunchProcess).
	Launcher Launcher
}

func (g *ExecGateways) log() *zap.Logger {
	if g.Log == nil {
		return zap.NewNop()
	}
	return g.Log
}

func (g *ExecGateways) hasUblk() bool {
	if g.HasUblk != nil {
		return g.HasUblk()
	}
	_, err := os.Stat(ublkControl)
	return err == nil
}

// Args is the attach command line of spec (without the binary): never a secret.
func (g *ExecGateways) Args(spec GatewaySpec) []string {
	args := []string{"attach", "--name", spec.Name, "--run-dir", g.RunDir, "--cache", spec.Cache.String()}
	args = append(args, g.Memory.args()...)
	fe := spec.Frontend
	if fe == FrontendAuto {
		fe = modes.NBD
		if g.hasUblk() {
			fe = modes.Ublk
		}
	}
	if fe == modes.Ublk {
		args = append(args, "--ublk")
	} else {
		// auto: a device left by a predecessor is found by the state file, not the number
		args = append(args, "--nbd", "auto")
	}
	for _, t := range spec.Targets {
		args = append(args, "--target", t)
	}
	if spec.CacheDev != "" {
		args = append(args, "--cache-dev", spec.CacheDev, "--cache-dev-size", strconv.FormatInt(spec.CacheDevSize, 10))
	}
	if spec.CHAPUser != "" {
		args = append(args, "--chap-user", spec.CHAPUser, "--chap-secret-file", spec.CHAPSecretFile)
	}
	if spec.TargetSecretFile != "" {
		if spec.TargetUser != "" {
			args = append(args, "--target-user", spec.TargetUser)
		}
		args = append(args, "--target-secret-file", spec.TargetSecretFile)
	}
	return args
}

// env is the gateway's environment: the plugin's, without CHAP secrets a CO might have put
// there (the gateway would prefer them to nothing), and with its run directory.
func (g *ExecGateways) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == chapcreds.EnvSecret || k == chapcreds.EnvSecretMutual || k == control.RunDirEnv || k == "NOTIFY_SOCKET" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, control.RunDirEnv+"="+g.RunDir)
}

// Ensure implements Gateways.
func (g *ExecGateways) Ensure(ctx context.Context, spec GatewaySpec) (status.Status, error) {
	if st, err := g.Status(ctx, spec.Name); err == nil {
		return g.await(ctx, spec.Name, st, nil)
	} else if !errors.Is(err, control.ErrUnknownGateway) {
		return status.Status{}, err
	}
	if err := control.EnsureRunDir(g.RunDir); err != nil {
		return status.Status{}, err
	}
	rs := RecordsIn(g.RunDir)
	if err := rs.ensure(); err != nil {
		return status.Status{}, err
	}
	logf, err := os.OpenFile(rs.LogFile(spec.Name), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return status.Status{}, fmt.Errorf("gateway log: %w", err)
	}
	defer logf.Close() // the child has its own descriptor
	cmd := exec.Command(g.Binary, g.Args(spec)...)
	cmd.Env = g.env()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return status.Status{}, fmt.Errorf("start gateway %s: %w", spec.Name, err)
	}
	if g.Launcher != nil {
		if err := g.Launcher.Place(ctx, spec.Name, cmd.Process.Pid); err != nil {
			// as if the plugin had died here: SIGKILL leaves a device it takes over waiting
			// (launch_systemd.go says why that is safe)
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return status.Status{}, fmt.Errorf("gateway %s not placed (launcher %s): %w; killed it (its log: %s)",
				spec.Name, g.Launcher.Mode(), err, rs.LogFile(spec.Name))
		}
	}
	g.log().Info("gateway started", zap.String("name", spec.Name), zap.Int("pid", cmd.Process.Pid),
		zap.Strings("args", cmd.Args[1:]), zap.String("log", rs.LogFile(spec.Name)))
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // reaps it whenever it ends, while this plugin lives
	return g.await(ctx, spec.Name, status.Status{}, exited)
}

// await queries name until it serves or has failed, its process exits (exited, when this
// process started it) or ctx ends. st is a status already read (zero: none yet).
func (g *ExecGateways) await(ctx context.Context, name string, st status.Status, exited <-chan error) (status.Status, error) {
	poll := g.Poll
	if poll <= 0 {
		poll = 50 * time.Millisecond
	}
	for {
		if settled(st) {
			return st, nil
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return status.Status{}, fmt.Errorf("gateway %s did not come up: %w (its log: %s)", name, ctx.Err(), RecordsIn(g.RunDir).LogFile(name))
		case err := <-exited:
			t.Stop()
			return status.Status{}, fmt.Errorf("gateway %s exited (%v) before it served; its log %s says why", name, err, RecordsIn(g.RunDir).LogFile(name))
		case <-t.C:
		}
		poll = min(2*poll, time.Second)
		var err error
		st, err = g.Status(ctx, name)
		if err != nil && !errors.Is(err, control.ErrUnknownGateway) { // not up yet is no error
			return status.Status{}, err
		}
	}
}

// settled reports whether a gateway has come up far enough to answer for: serving, or failed
// (fenced by its takeover, no path), which the caller reads from status.Check.
func settled(st status.Status) bool {
	return st.Gateway.State == "ready" || st.Gateway.State == "failed" || st.Gateway.Fenced
}

// Status implements Gateways.
func (g *ExecGateways) Status(ctx context.Context, name string) (status.Status, error) {
	c, err := control.Dial(ctx, g.RunDir, name)
	if err != nil {
		return status.Status{}, err
	}
	return c.Status(ctx)
}

// Detach implements Gateways.
func (g *ExecGateways) Detach(ctx context.Context, name string) error {
	c, err := control.Dial(ctx, g.RunDir, name)
	if err == nil {
		_, err = c.Detach(ctx, control.DetachOptions{}, nil)
	}
	if errors.Is(err, control.ErrUnknownGateway) {
		return nil
	}
	return err
}

// Waiting implements Gateways.
func (g *ExecGateways) Waiting(name string) bool {
	_, err := os.Stat(statefile.Path(g.RunDir, name))
	return !errors.Is(err, fs.ErrNotExist)
}
