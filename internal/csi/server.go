package csi

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/internal/control"
)

// DefaultStopTimeout bounds the graceful stop: calls in flight (a mkfs, a detach's write-back)
// get this long to end before the server stops hard. A call cut short is retried by the CO, and
// each step of it is idempotent.
const DefaultStopTimeout = 30 * time.Second

// Options configure the plugin's server.
type Options struct {
	Endpoint string // unix:///PATH: the CSI socket (the only transport a CO uses for a node plugin)
	NodeID   string
	// MaxVolumes is NodeGetInfo's max_volumes_per_node, and NodeStage refuses a volume beyond it
	// (0: no limit). With Memory set it is Memory.Volumes.
	MaxVolumes int64
	// Memory, when set, sizes every gateway's pool and cache from the plugin's budget
	// (PlanMemory); unset, gateways take attach's defaults.
	Memory   *MemoryPlan
	RunDir   string // the gateways' run directory (control.RunDir)
	Binary   string // the iser-blk executable the gateways run (default: Gateways must be set)
	Gateways Gateways
	Mounter  Mounter // nil: SystemMounter
	// Controller, when set, is served as the Controller service and CONTROLLER_SERVICE is
	// advertised (the LUN pool, `--pool`).
	Controller  csipb.ControllerServer
	StopTimeout time.Duration // 0: DefaultStopTimeout
	Log         *zap.Logger
	// Listening, when set, is called with the socket's path once it accepts connections.
	Listening func(path string)
	// Launcher is where the gateways Serve starts live (when Gateways is nil): launch.go.
	// Zero: LaunchProcess.
	Launcher LaunchMode
	// CacheDevDir is where volumes that ask for a cache device (KeyCacheDevSize) keep it; empty:
	// such volumes are refused.
	CacheDevDir string
}

// Serve runs the plugin until ctx ends (the command cancels it on SIGTERM), then stops
// gracefully. It heals in the background (Node.Heal) while it serves. The gateways are not
// stopped: they outlive the plugin by design.
func Serve(ctx context.Context, o Options) error {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.NodeID == "" {
		return errors.New("a node id is required")
	}
	if o.RunDir == "" {
		o.RunDir = control.RunDir("")
	}
	if o.Gateways == nil {
		if o.Binary == "" {
			return errors.New("no gateway binary")
		}
		launcher, err := NewLauncher(ctx, o.Launcher, o.Log)
		if err != nil {
			return err
		}
		o.Log.Info("gateway launcher", zap.String("launcher", string(launcher.Mode())), zap.String("asked", string(o.Launcher)))
		eg := &ExecGateways{Binary: o.Binary, RunDir: o.RunDir, Log: o.Log, Launcher: launcher}
		if o.Memory != nil {
			eg.Memory = o.Memory.Share
		}
		o.Gateways = eg
	}
	if o.Memory != nil {
		o.MaxVolumes = o.Memory.Volumes
	}
	if o.Mounter == nil {
		o.Mounter = SystemMounter{}
	}
	if o.StopTimeout <= 0 {
		o.StopTimeout = DefaultStopTimeout
	}
	path, err := SocketPath(o.Endpoint)
	if err != nil {
		return err
	}
	if err := control.EnsureRunDir(o.RunDir); err != nil {
		return err
	}
	// nbd.Listen's unix listener is what the plugin needs too: a stale socket removed (never a
	// live one, never another file), the new one 0600 so only root reaches it.
	l, _, err := nbd.Listen("unix://" + path)
	if err != nil {
		return err
	}
	node := NewNode(NodeOptions{NodeID: o.NodeID, MaxVolumes: o.MaxVolumes, RunDir: o.RunDir,
		Gateways: o.Gateways, Mounter: o.Mounter, CacheDevDir: o.CacheDevDir, Log: o.Log})
	srv := grpc.NewServer(grpc.UnaryInterceptor(logCalls(o.Log)))
	csipb.RegisterIdentityServer(srv, &Identity{controller: o.Controller != nil})
	csipb.RegisterNodeServer(srv, node)
	if o.Controller != nil {
		csipb.RegisterControllerServer(srv, o.Controller)
	}
	o.Log.Info("CSI plugin serving", zap.String("endpoint", path), zap.String("driver", DriverName),
		zap.String("node_id", o.NodeID), zap.String("run_dir", o.RunDir), zap.Bool("controller", o.Controller != nil))
	healCtx, stopHeal := context.WithCancel(ctx)
	healed := make(chan struct{})
	go func() {
		defer close(healed)
		res, err := node.Heal(healCtx)
		o.Log.Info("healer done", zap.Int("adopted", res.Adopted), zap.Int("restarted", res.Restarted),
			zap.Int("failed", res.Failed), zap.Error(err))
	}()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	if o.Listening != nil {
		o.Listening(path)
	}
	select {
	case err := <-served: // the listener failed: nothing graceful left to do
		stopHeal()
		<-healed
		return fmt.Errorf("CSI server: %w", err)
	case <-ctx.Done():
	}
	o.Log.Info("stopping the CSI plugin (the gateways keep serving)")
	stopHeal()
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	t := time.NewTimer(o.StopTimeout)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		o.Log.Warn("calls still running at the stop timeout; stopping hard", zap.Duration("timeout", o.StopTimeout))
		srv.Stop()
		<-stopped
	}
	<-healed
	<-served
	return nil
}

// SocketPath is the socket path of a unix:// endpoint (unix:///csi/csi.sock, or unix:/csi/csi.sock
// as some COs write it); any other endpoint is refused.
func SocketPath(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "unix" || u.Host != "" || u.Path == "" || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("endpoint %q: want unix:///PATH", endpoint)
	}
	if !filepath.IsAbs(u.Path) {
		return "", fmt.Errorf("endpoint %q: the socket path must be absolute", endpoint)
	}
	return filepath.Clean(u.Path), nil
}

// volumeRequest is every request that names a volume.
type volumeRequest interface{ GetVolumeId() string }

// periodic are the calls a CO repeats on a timer (kubelet: every minute per volume); their
// successes are logged at debug level so that the log shows what changed.
var periodic = map[string]bool{
	"/csi.v1.Identity/Probe": true, "/csi.v1.Identity/GetPluginInfo": true, "/csi.v1.Identity/GetPluginCapabilities": true,
	"/csi.v1.Node/NodeGetVolumeStats": true, "/csi.v1.Node/NodeGetCapabilities": true, "/csi.v1.Node/NodeGetInfo": true,
}

// logCalls logs every call: its method, the volume it names, its duration and its outcome.
// Never the request itself: NodeStage's carries the CHAP secrets.
func logCalls(log *zap.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		fields := []zap.Field{zap.String("method", info.FullMethod), zap.Duration("took", time.Since(start))}
		if vr, ok := req.(volumeRequest); ok {
			fields = append(fields, zap.String("volume_id", vr.GetVolumeId()))
		}
		if err != nil {
			st := status.Convert(err)
			log.Warn("CSI call failed", append(fields, zap.Stringer("code", st.Code()), zap.String("error", st.Message()))...)
		} else if periodic[info.FullMethod] {
			log.Debug("CSI call", fields...)
		} else {
			log.Info("CSI call", fields...)
		}
		return resp, err
	}
}
