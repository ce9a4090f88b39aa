package iser

// The two forms `iser-blk info` prints an Info in: the table people read and the stable JSON.

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/dustin/go-humanize"
)

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func sizeOrNotReported(n int64) string {
	if n == 0 {
		return "not reported"
	}
	return fmt.Sprintf("%d bytes (%s)", n, humanize.IBytes(uint64(n)))
}

// WriteText prints the table `iser-blk info` shows people.
func (in Info) WriteText(w io.Writer) error {
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
	row("Max transfer", sizeOrNotReported(in.MaxTransfer))
	row("Optimal transfer", sizeOrNotReported(in.OptimalTransfer))
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

// infoJSON is the stable machine-readable form (`iser-blk info --json`): its field names and
// types do not change.
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

// WriteJSON prints the stable machine-readable form, infoJSON, indented.
func (in Info) WriteJSON(w io.Writer) error {
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
