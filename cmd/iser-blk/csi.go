package main

// csi: the Container Storage Interface plugin (internal/csi). This file only turns flags into
// csi.Options; the plugin, its gateways and its healer are internal/csi's.

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/internal/cli"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/csi"
	"github.com/iser-blk/iser-blk/internal/csipool"
	"github.com/iser-blk/iser-blk/internal/logging"
	"github.com/iser-blk/iser-blk/internal/memlimit"
)

// groupCSI is the help group of the plugin's own flags.
const groupCSI = "CSI plugin (docs/csi.md)"

// Values of --pool-erase.
const (
	poolEraseZeroes = "zeroes" // deleted volumes' LUNs are zeroed before they are handed out again
	poolEraseNone   = "none"   // the array erases returned LUNs itself
)

// csiFlags are `iser-blk csi`'s flags.
type csiFlags struct {
	endpoint   string
	nodeID     string
	pool       string
	claims     string
	poolErase  string
	initiator  string
	maxVolumes int64
	budget     string
	runDir     string
	launcher   string
	cacheDir   string
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
		func(cmd *cobra.Command, _ []string) int {
			return runCSI(cmd.Context(), &f, !cmd.Flags().Changed("max-volumes"), cmd.ErrOrStderr())
		})
	cli.Group(cmd, groupCSI, func(fs *pflag.FlagSet) {
		fs.StringVar(&f.endpoint, "endpoint", "", "the CSI socket: unix:///PATH (created 0600; a stale one is replaced)")
		fs.StringVar(&f.nodeID, "node-id", "", "this node's id for the CO (NodeGetInfo), e.g. the Kubernetes node name")
		fs.StringVar(&f.pool, "pool", "", "serve the Controller service from this LUN pool file")
		fs.StringVar(&f.initiator, "initiator-name", "", "with --pool: the IQN the pool's LUNs are probed with (default: as attach's)")
		fs.StringVar(&f.claims, "pool-claims", csipool.DefaultClaimsFile, "with --pool: the file that records which volume holds which LUN (keep it: losing it frees every LUN)")
		fs.StringVar(&f.poolErase, "pool-erase", poolEraseZeroes, "with --pool: "+poolEraseZeroes+" (zero a deleted volume's LUN before handing it out again) or "+poolEraseNone+" (the array erases returned LUNs itself)")
		fs.Int64Var(&f.maxVolumes, "max-volumes", csi.DefaultMaxVolumes, "volumes this node takes at most (NodeGetInfo), each gateway getting this share of --memory-budget; not given: lowered to what the budget holds")
		fs.StringVar(&f.budget, "memory-budget", csi.DefaultMemoryBudget, "memory for all gateways' buffer pools and caches: a size, or a percentage of what the plugin may use (its cgroup's limit or the host's memory)")
	})
	cli.Group(cmd, groupService, func(fs *pflag.FlagSet) {
		fs.StringVar(&f.runDir, "run-dir", "", "the gateways' run directory, on a hostPath (default: $"+control.RunDirEnv+" or "+control.DefaultRunDir+")")
		fs.StringVar(&f.cacheDir, "cache-dev-dir", "", "where volumes with the cache-dev-size attribute keep their persistent write-back log (a directory on a local disk, kept across reboots); without it such volumes are refused")
		fs.StringVar(&f.launcher, "launcher", string(csi.LaunchAuto), "where the gateways live: systemd-scope (a scope unit of the host's systemd: they outlive the plugin's container), process (the plugin's cgroup), or auto: systemd-scope when the host's systemd answers")
	})
	cmd.Flags().BoolVar(&f.debug, "debug", false, "debug logging")
	cli.CompleteFiles(cmd, "pool")
	cli.CompleteWords(cmd, "pool-erase", poolEraseZeroes, poolEraseNone)
	cli.CompleteDirs(cmd, "run-dir")
	cli.CompleteWords(cmd, "launcher", string(csi.LaunchAuto), string(csi.LaunchProcess), string(csi.LaunchSystemdScope))
	return cmd
}

// runCSI runs the plugin; a flag mistake is reported on stderr with exit 2 before anything
// listens. fitVolumes: --max-volumes was not given, so the memory budget may lower it.
func runCSI(ctx context.Context, f *csiFlags, fitVolumes bool, stderr io.Writer) int {
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "iser-blk csi: %s\n", fmt.Sprintf(format, a...))
		return exitUsage
	}
	switch {
	case f.endpoint == "":
		return usage("--endpoint is required (unix:///PATH)")
	case f.nodeID == "":
		return usage("--node-id is required")
	case f.maxVolumes < 1:
		return usage("--max-volumes must be at least 1")
	case f.poolErase != poolEraseZeroes && f.poolErase != poolEraseNone:
		return usage("--pool-erase %q: want %s or %s", f.poolErase, poolEraseZeroes, poolEraseNone)
	}
	memLimit := memlimit.Own()
	budget, err := csi.ParseBudget(f.budget, memLimit)
	if err != nil {
		return usage("%v", err)
	}
	plan, err := csi.PlanMemory(budget, f.maxVolumes, fitVolumes, memLimit)
	if err != nil {
		return usage("%v", err)
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
	log.Info("memory budget", zap.String("budget", humanize.IBytes(uint64(plan.Budget))), zap.Int64("max_volumes", plan.Volumes),
		zap.String("buffer_memory", humanize.IBytes(uint64(plan.Share.BufferMemory))), zap.String("cache_size", humanize.IBytes(uint64(plan.Share.CacheSize))),
		zap.String("memory_limit", humanize.IBytes(uint64(memLimit))))
	bin, err := os.Executable()
	if err != nil {
		return fail("csi", err)
	}
	o := csi.Options{Endpoint: f.endpoint, NodeID: f.nodeID, Memory: &plan,
		RunDir: control.RunDir(f.runDir), Binary: bin, Launcher: launcher, CacheDevDir: f.cacheDir, Log: log}
	if f.pool != "" {
		name, err := initiatorNameOr(f.initiator, log)
		if err != nil {
			return fail("csi", fmt.Errorf("probing the pool's LUNs: %w", err))
		}
		ctl, err := csipool.NewISER(csipool.Config{Pool: pool, ClaimsFile: f.claims, NoErase: f.poolErase == poolEraseNone, Logger: log},
			csipool.LoginOptions(name))
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
