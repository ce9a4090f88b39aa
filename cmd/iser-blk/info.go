package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
)

func init() {
	register(&command{name: "info", summary: "show a LUN's identity, capacity and limits", run: runInfo})
}

func runInfo(ctx context.Context, args []string) int {
	var tf targetFlags
	var asJSON bool
	fs := newFlagSet("info", "[flags] iscsi://[user@]host[:port]/IQN/LUN",
		"Log in to the target, probe the LUN (INQUIRY and VPD pages, READ CAPACITY, MODE SENSE)\n"+
			"and print its identity, capacity and limits. iser:// URLs use the RDMA transport.")
	tf.register(fs, false)
	fs.BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	pos, code, done := parseOrExit(fs, args, 1)
	if done {
		return code
	}
	t, err := iser.ParseURL(pos[0])
	if err != nil {
		return fail("info", err)
	}
	log := commandLogger(tf.debug)
	defer log.Sync() //nolint:errcheck
	opts, err := tf.options(t.User, log)
	if err != nil {
		return fail("info", err)
	}
	opts.ReadOnly = true // info never writes
	d, err := iser.Open(ctx, pos[0], opts)
	if err != nil {
		return fail("info", err)
	}
	info := d.Info()
	if err := d.Close(); err != nil {
		// The LUN's description is complete; a failed logout only leaves the target to time
		// the session out, so it is reported (stderr), not made the command's failure.
		log.Warn("logout failed", zap.Error(err))
	}
	if asJSON {
		err = writeInfoJSON(os.Stdout, info)
	} else {
		err = writeInfo(os.Stdout, info)
	}
	if err != nil {
		return fail("info", err)
	}
	return exitOK
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func size(n int64) string {
	if n == 0 {
		return "not reported"
	}
	return fmt.Sprintf("%d bytes (%s)", n, humanize.IBytes(uint64(n)))
}

// writeInfo prints the table people read.
func writeInfo(w io.Writer, in iser.Info) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("URL", in.URL)
	row("Vendor", in.Vendor)
	row("Product", in.Product)
	row("Revision", in.Revision)
	row("Serial", in.Serial)
	row("WWN", in.WWN)
	var ids []string
	for _, d := range in.Designators {
		ids = append(ids, d.String())
	}
	if len(ids) > 0 {
		row("Designators", strings.Join(ids, ", "))
	}
	row("Capacity", fmt.Sprintf("%d bytes (%s, %d blocks)", in.Capacity, humanize.IBytes(uint64(in.Capacity)), in.Blocks))
	row("Logical block size", fmt.Sprint(in.LogicalBlockSize))
	row("Physical block size", fmt.Sprint(in.PhysicalBlockSize))
	row("Max transfer", size(in.MaxTransfer))
	row("Optimal transfer", size(in.OptimalTransfer))
	thin := yesNo(in.ThinProvisioned)
	if in.ThinProvisioned || in.UnmapSupported || in.WriteSameUnmap {
		thin += fmt.Sprintf(" (unmap %s, write same unmap %s, zeroes after unmap %s)",
			yesNo(in.UnmapSupported), yesNo(in.WriteSameUnmap), yesNo(in.ZeroesAfterUnmap))
	}
	row("Thin provisioning", thin)
	wc := "enabled"
	switch {
	case !in.WriteCacheKnown:
		wc = "unknown (assumed enabled)"
	case !in.WriteCache:
		wc = "disabled"
	}
	row("Write cache", wc)
	row("FUA", yesNo(in.FUA))
	row("Write same", in.WriteSame)
	row("Rotational", yesNo(in.Rotational))
	row("Read-only", yesNo(in.ReadOnly))
	return tw.Flush()
}

// infoJSON is the stable machine-readable form.
type infoJSON struct {
	URL               string   `json:"url"`
	LUN               uint16   `json:"lun"`
	Vendor            string   `json:"vendor"`
	Product           string   `json:"product"`
	Revision          string   `json:"revision"`
	Serial            string   `json:"serial"`
	WWN               string   `json:"wwn"`
	Designators       []string `json:"designators"`
	CapacityBytes     int64    `json:"capacity_bytes"`
	Blocks            uint64   `json:"blocks"`
	LogicalBlockSize  uint32   `json:"logical_block_size"`
	PhysicalBlockSize uint32   `json:"physical_block_size"`
	MaxTransfer       int64    `json:"max_transfer_bytes"`
	OptimalTransfer   int64    `json:"optimal_transfer_bytes"`
	ThinProvisioned   bool     `json:"thin_provisioned"`
	Unmap             bool     `json:"unmap"`
	WriteSameUnmap    bool     `json:"write_same_unmap"`
	ZeroesAfterUnmap  bool     `json:"zeroes_after_unmap"`
	WriteSame         string   `json:"write_same"`
	WriteCache        bool     `json:"write_cache"`
	WriteCacheKnown   bool     `json:"write_cache_known"`
	FUA               bool     `json:"fua"`
	Rotational        bool     `json:"rotational"`
	ReadOnly          bool     `json:"read_only"`
}

func writeInfoJSON(w io.Writer, in iser.Info) error {
	out := infoJSON{
		URL: in.URL, LUN: in.LUN, Vendor: in.Vendor, Product: in.Product, Revision: in.Revision,
		Serial: in.Serial, WWN: in.WWN, Designators: []string{}, CapacityBytes: in.Capacity, Blocks: in.Blocks,
		LogicalBlockSize: in.LogicalBlockSize, PhysicalBlockSize: in.PhysicalBlockSize,
		MaxTransfer: in.MaxTransfer, OptimalTransfer: in.OptimalTransfer, ThinProvisioned: in.ThinProvisioned,
		Unmap: in.UnmapSupported, WriteSameUnmap: in.WriteSameUnmap, ZeroesAfterUnmap: in.ZeroesAfterUnmap,
		WriteSame: in.WriteSame, WriteCache: in.WriteCache, WriteCacheKnown: in.WriteCacheKnown,
		FUA: in.FUA, Rotational: in.Rotational, ReadOnly: in.ReadOnly,
	}
	for _, d := range in.Designators {
		out.Designators = append(out.Designators, d.String())
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
