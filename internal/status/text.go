package status

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
)

// WriteList prints one line per gateway, as `iser-blk list` shows them. unresponsive names the
// gateways that hold their name but did not answer.
func WriteList(w io.Writer, gateways []Gateway, unresponsive []string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tPID\tFRONTEND\tTARGET\tCACHE\tSTATE\tUPTIME")
	for _, g := range gateways {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", g.Name, g.PID, g.FrontendPath,
			strings.Join(g.Targets, ","), g.CacheMode, g.State, uptime(g.UptimeSeconds))
	}
	for _, name := range unresponsive {
		fmt.Fprintf(tw, "%s\t-\t-\t-\t-\tunresponsive\t-\n", name)
	}
	return tw.Flush()
}

// WriteText prints st for a terminal, as `iser-blk status` shows it (sizes humanized).
func WriteText(w io.Writer, st Status) error {
	g := st.Gateway
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "gateway\t%s (PID %d), %s %s\n", g.Name, g.PID, g.FrontendKind, g.FrontendPath)
	state := g.State
	if g.StateReason != "" {
		state += ": " + g.StateReason
	}
	fmt.Fprintf(tw, "state\t%s, up %s\n", state, uptime(g.UptimeSeconds))
	fmt.Fprintf(tw, "targets\t%s\n", strings.Join(g.Targets, ", "))
	if l := st.LUN; l != nil {
		fmt.Fprintf(tw, "lun\t%s, %d-byte blocks, %s %s, max transfer %s, max unmap %s\n",
			humanize.IBytes(l.SizeBytes), l.BlockSize, l.Vendor, l.Product,
			limit(l.MaxTransferBytes), limit(l.MaxUnmapBytes))
	}
	if f := st.Frontend; f != nil {
		fmt.Fprintf(tw, "frontend\t%s: %d connections, %d queues, depth %d, %d in flight\n",
			f.Kind, f.Connections, f.Queues, f.QueueDepth, st.IO.InFlight)
	}
	if c := st.Cache; c != nil {
		writeCache(tw, c)
	}
	for _, p := range st.Paths {
		writePath(tw, p)
	}
	if r := st.RDMA; r != nil {
		fmt.Fprintf(tw, "rdma\t%d sends in %d posts, %d receives in %d posts, %d completions, %d completion events (%d missed)\n",
			r.SendWorkRequests, r.SendPosts, r.RecvWorkRequests, r.RecvPosts, r.Completions, r.CompletionEvents, r.MissedCompletionEvents)
	}
	for _, op := range st.IO.Ops {
		fmt.Fprintf(tw, "io %s\t%d requests, %d errors, %s\n", op.Op, op.Requests, op.Errors, humanize.IBytes(op.Bytes))
	}
	return tw.Flush()
}

func writeCache(w io.Writer, c *Cache) {
	fmt.Fprintf(w, "cache\t%s: %s of %s used, %s dirty, hit ratio %.1f%%, %s written back, throttled %s\n",
		c.Mode, humanize.IBytes(c.UsedBytes), humanize.IBytes(c.CapacityBytes), humanize.IBytes(c.DirtyBytes),
		100*c.HitRatio, humanize.IBytes(c.WrittenBackBytes), seconds(c.ThrottledSeconds))
	if c.LastWriteBackError != "" {
		fmt.Fprintf(w, "cache error\t%s\n", c.LastWriteBackError)
	}
	if d := c.Device; d != nil {
		fmt.Fprintf(w, "cache device\t%s: %s of %s log used, %s dirty, %s written back, index %s\n",
			d.Path, humanize.IBytes(d.LogBytes), humanize.IBytes(d.CapacityBytes), humanize.IBytes(d.DirtyBytes),
			humanize.IBytes(d.WrittenBackBytes), humanize.IBytes(d.IndexMemoryBytes))
		if d.Failed != "" {
			fmt.Fprintf(w, "cache device error\t%s\n", d.Failed)
		}
	}
}

func writePath(w io.Writer, p Path) {
	n := p.Negotiated
	fmt.Fprintf(w, "path %s\t%s %s, ALUA %s, NOP %s (mean %s), %d reconnects, %d replayed, %d aborts, %d LUN resets\n",
		p.Portal, p.Transport, p.State, orDash(p.ALUAState), seconds(p.NopRoundTrip.LastSeconds),
		seconds(p.NopRoundTrip.MeanSeconds), p.Reconnects, p.Replayed, p.Aborts, p.LUNResets)
	fmt.Fprintf(w, "\tMaxRecvDataSegmentLength %s/%s (initiator/target), MaxBurstLength %s, FirstBurstLength %s, ImmediateData %s, InitialR2T %s, digests %s/%s, window %d, iSER RDMA extensions %s\n",
		humanize.IBytes(uint64(n.MaxRecvDataSegmentLengthInitiator)), humanize.IBytes(uint64(n.MaxRecvDataSegmentLengthTarget)),
		humanize.IBytes(uint64(n.MaxBurstLength)), humanize.IBytes(uint64(n.FirstBurstLength)),
		yesNo(n.ImmediateData), yesNo(n.InitialR2T), n.HeaderDigest, n.DataDigest, n.CommandWindow, yesNo(n.RDMAExtensions))
}

func uptime(s float64) string { return (time.Duration(s) * time.Second).Round(time.Second).String() }

func seconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Microsecond).String()
}

func limit(b uint64) string {
	if b == 0 {
		return "-"
	}
	return humanize.IBytes(b)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "Yes"
	}
	return "No"
}
