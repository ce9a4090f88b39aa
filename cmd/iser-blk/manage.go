package main

// list, status and detach: the operator's side of the control sockets (internal/control) of the
// gateways running on this host. Exit codes: 0 ok, 1 refused or failed, 2 usage, 4 no gateway by
// that name or device.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/iser-blk/iser-blk/internal/cli"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/status"
)

// queryTimeout bounds list and status.
const queryTimeout = 10 * time.Second

// addRunDir adds --run-dir, the Service group of the commands that talk to a running gateway.
func addRunDir(cmd *cobra.Command, runDir *string) {
	cli.Group(cmd, groupService, func(fs *pflag.FlagSet) {
		fs.StringVar(runDir, "run-dir", "", "directory of the control sockets (default: $"+control.RunDirEnv+" or "+control.DefaultRunDir+")")
	})
	cli.CompleteDirs(cmd, "run-dir")
}

// newListCmd is `iser-blk list`.
func newListCmd() *cobra.Command {
	var runDir string
	var asJSON bool
	cmd := cli.Leaf("list [--json]", "list the gateways running on this host",
		"One line per gateway running on this host. A dead gateway leaves no line.", 0,
		func(cmd *cobra.Command, _ []string) int { return runList(cmd.Context(), runDir, asJSON) })
	addRunDir(cmd, &runDir)
	cli.Group(cmd, groupOutput, func(fs *pflag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print a JSON array of the gateways (status schema version 1, gateway part)")
	})
	return cmd
}

func runList(ctx context.Context, runDir string, asJSON bool) int {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	entries, err := control.List(ctx, control.RunDir(runDir), 0)
	if err != nil {
		return fail("list", err)
	}
	gateways := []status.Gateway{}
	var unresponsive []string
	for _, e := range entries {
		if e.Err != nil {
			unresponsive = append(unresponsive, e.Name)
			continue
		}
		gateways = append(gateways, e.Status.Gateway)
	}
	if asJSON {
		return printJSON("list", gateways)
	}
	if err := status.WriteList(os.Stdout, gateways, unresponsive); err != nil {
		return fail("list", err)
	}
	return exitOK
}

// newStatusCmd is `iser-blk status NAME`.
func newStatusCmd() *cobra.Command {
	var runDir string
	var asJSON, check bool
	cmd := cli.Leaf("status NAME|DEVICE [--json] [--check]", "show a running gateway's paths, LUN, cache and I/O",
		"Show a running gateway's state, paths, LUN, frontend, cache and I/O counters.\n"+
			"With --check the exit code says whether it is healthy: 0 serving with every path up, 1 fenced,\n"+
			"failed, not serving or degraded (a path down), with the reason on stderr.", 1,
		func(cmd *cobra.Command, pos []string) int {
			return runStatus(cmd.Context(), runDir, pos[0], asJSON, check)
		})
	addRunDir(cmd, &runDir)
	cli.Group(cmd, groupOutput, func(fs *pflag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print the status as JSON (schema version 1, docs/operations.md)")
		fs.BoolVar(&check, "check", false, "exit 1 unless the gateway serves with every path up (for monitoring and scripts)")
	})
	return cmd
}

func runStatus(ctx context.Context, runDir, name string, asJSON, check bool) int {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	c, err := control.Dial(ctx, control.RunDir(runDir), name)
	if err != nil {
		return manageFail("status", err)
	}
	st, err := c.Status(ctx)
	if err != nil {
		return manageFail("status", err)
	}
	code := exitOK
	if asJSON {
		code = printJSON("status", st)
	} else if err := status.WriteText(os.Stdout, st); err != nil {
		return fail("status", err)
	}
	if h := status.Check(st); check && !h.Healthy && code == exitOK {
		fmt.Fprintf(os.Stderr, "iser-blk status: %s is not healthy: %s\n", st.Gateway.Name, h.Why)
		return exitFailure
	}
	return code
}

// newDetachCmd is `iser-blk detach NAME`.
func newDetachCmd() *cobra.Command {
	var runDir string
	var opts control.DetachOptions
	cmd := cli.Leaf("detach NAME|DEVICE [--force] [--timeout D]", "stop a gateway: drain, write back, remove its device",
		"Stop a gateway the way SIGTERM does: stop taking I/O, drain, write back every dirty byte\n"+
			"(progress is shown here), log out, remove the device. Returns once the process is gone.\n"+
			"A mounted or open device is refused unless --force; a failed write-back keeps the gateway\n"+
			"running with its data and exits 1.", 1,
		func(cmd *cobra.Command, pos []string) int { return runDetach(cmd.Context(), runDir, pos[0], opts) })
	addRunDir(cmd, &runDir)
	cli.Group(cmd, groupService, func(fs *pflag.FlagSet) {
		fs.BoolVar(&opts.Force, "force", false, "detach even if the device is mounted or held open")
		fs.DurationVar(&opts.Timeout, "timeout", 0, "give up after this long (0: wait for the write-back however long it takes)")
	})
	return cmd
}

func runDetach(ctx context.Context, runDir, name string, opts control.DetachOptions) int {
	return handOver(ctx, "detach", runDir, name, func(c *control.Client, progress func(control.Progress)) (control.DetachResult, error) {
		return c.Detach(ctx, opts, progress)
	}, "detached %s (PID %d): %s written back")
}

// printProgress shows a detach's progress on the caller's terminal (stderr: stdout is the
// result).
func printProgress(p control.Progress) { fmt.Fprintln(os.Stderr, p) }

// manageFail prints err and returns the control client's exit code (4 for an unknown gateway).
func manageFail(name string, err error) int {
	fmt.Fprintf(os.Stderr, "iser-blk %s: %v\n", name, err)
	return control.ExitCode(err)
}

func printJSON(name string, v any) int {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fail(name, err)
	}
	return exitOK
}
