package main

// csi: the Container Storage Interface plugin (internal/csi). This file only turns flags into
// csi.Options; the plugin, its gateways and its healer are internal/csi's.

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/internal/cli"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/csi"
	"github.com/iser-blk/iser-blk/internal/csipool"
	"github.com/iser-blk/iser-blk/internal/initiatorname"
	"github.com/iser-blk/iser-blk/internal/logging"
)

// groupCSI is the help group of the plugin's own flags.
const groupCSI = "CSI plugin (docs/csi.md)"

// newPoolController builds the Controller service of --pool FILE (internal/csipool) over the
// pool's LUNs: sizes probed with this host's initiator name, claims in
// claims (csipool.DefaultClaimsFile by default). The caller closes it.
func newPoolController(luns []csipool.LUN, claims, name string, log *zap.Logger) (*csipool.Controller, error) {
	if name == "" {
		n, generated, err := initiatorname.Host("/")
		if err != nil {
			return nil, fmt.Errorf("no initiator name for probing the pool's LUNs: %w; give --initiator-name", err)
		}
		if generated {
			log.Info("generated this host's initiator name", zap.String("initiator_name", n), zap.String("kept_in", initiatorname.OwnFile))
		}
		name = n
	}
	return csipool.New(csipool.Config{Pool: luns, ClaimsFile: claims, Logger: log,
		Prober: csipool.ISERProber{Options: iser.Options{InitiatorName: name}}})
}

// csiFlags are `iser-blk csi`'s flags.
type csiFlags struct {
	endpoint   string
	nodeID     string
	pool       string
	claims     string
	initiator  string
	maxVolumes int64
	runDir     string
	launcher   string
	debug      bool
}

// newCSICmd is `iser-blk csi`.
func newCSICmd() *cobra.Command {
	var f csiFlags
	cmd := cli.Leaf("csi --endpoint unix:///PATH --node-id ID [--pool FILE] [flags]",
		"run the CSI plugin: stage iSCSI/iSER LUNs as block devices or filesystems for containers",
		"Serve the Container Storage Interface (v1.13) on a unix socket until SIGTERM: Identity and Node\n"+
			"(and Controller with --pool). Each staged volume gets its own gateway process, `iser-blk attach\n"+
			"--name csi-HASH`, which outlives the plugin: a restarted plugin adopts the gateways it finds in\n"+
			"--run-dir and restarts those whose devices wait for them. Volume attributes and secrets:\n"+
			"docs/csi.md.", 0,
		func(cmd *cobra.Command, _ []string) int { return runCSI(cmd.Context(), &f, cmd.ErrOrStderr()) })
	cli.Group(cmd, groupCSI, func(fs *pflag.FlagSet) {
		fs.StringVar(&f.endpoint, "endpoint", "", "the CSI socket: unix:///PATH (created 0600; a stale one is replaced)")
		fs.StringVar(&f.nodeID, "node-id", "", "this node's id for the CO (NodeGetInfo), e.g. the Kubernetes node name")
		fs.StringVar(&f.pool, "pool", "", "serve the Controller service from this LUN pool file")
		fs.StringVar(&f.initiator, "initiator-name", "", "with --pool: the IQN the pool's LUNs are probed with (default: as attach's)")
		fs.StringVar(&f.claims, "pool-claims", csipool.DefaultClaimsFile, "with --pool: the file that records which volume holds which LUN (keep it: losing it frees every LUN)")
		fs.Int64Var(&f.maxVolumes, "max-volumes", 0, "volumes this node takes at most (NodeGetInfo; 0: no limit)")
	})
	cli.Group(cmd, groupService, func(fs *pflag.FlagSet) {
		fs.StringVar(&f.runDir, "run-dir", "", "the gateways' run directory, on a hostPath (default: $"+control.RunDirEnv+" or "+control.DefaultRunDir+")")
		fs.StringVar(&f.launcher, "launcher", string(csi.LaunchAuto), "where the gateways live: systemd-scope (a scope unit of the host's systemd: they outlive the plugin's container), process (the plugin's cgroup), or auto: systemd-scope when the host's systemd answers")
	})
	cmd.Flags().BoolVar(&f.debug, "debug", false, "debug logging")
	cli.CompleteFiles(cmd, "pool")
	cli.CompleteDirs(cmd, "run-dir")
	cli.CompleteWords(cmd, "launcher", string(csi.LaunchAuto), string(csi.LaunchProcess), string(csi.LaunchSystemdScope))
	return cmd
}

// runCSI runs the plugin; a flag mistake is reported on stderr with exit 2 before anything
// listens.
func runCSI(ctx context.Context, f *csiFlags, stderr io.Writer) int {
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "iser-blk csi: %s\n", fmt.Sprintf(format, a...))
		return exitUsage
	}
	switch {
	case f.endpoint == "":
		return usage("--endpoint is required (unix:///PATH)")
	case f.nodeID == "":
		return usage("--node-id is required")
	case f.maxVolumes < 0:
		return usage("--max-volumes must not be negative")
	}
	if _, err := csi.SocketPath(f.endpoint); err != nil {
		return usage("--endpoint: %v", err)
	}
	launcher, err := csi.ParseLaunchMode(f.launcher)
	if err != nil {
		return usage("--launcher: %v", err)
	}
	var pool []csipool.LUN
	if f.pool != "" {
		var err error
		if pool, err = csipool.ReadPool(f.pool); err != nil {
			return usage("--pool: %v", err)
		}
	}
	log := logging.Process(f.debug)
	defer log.Sync() //nolint:errcheck
	bin, err := os.Executable()
	if err != nil {
		return fail("csi", err)
	}
	o := csi.Options{Endpoint: f.endpoint, NodeID: f.nodeID, MaxVolumes: f.maxVolumes,
		RunDir: control.RunDir(f.runDir), Binary: bin, Launcher: launcher, Log: log}
	if f.pool != "" {
		ctl, err := newPoolController(pool, f.claims, f.initiator, log)
		if err != nil {
			return fail("csi", err)
		}
		defer ctl.Close()
		o.Controller = ctl
	}
	if err := csi.Serve(ctx, o); err != nil {
		return fail("csi", err)
	}
	return exitOK
}
