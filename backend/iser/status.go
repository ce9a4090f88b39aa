package iser

import (
	"strings"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/rdma"
	"github.com/iser-blk/iser-blk/internal/status"
)

// The backend's part of `iser-blk status` and the metrics (issue 16): every path with what its
// login negotiated and its recovery counters, and the LUN as probed. Read from the same atomics
// as PathStats, off the data path.

// paramsReporter is an Executor that can say what its current connection negotiated (a session).
type paramsReporter interface{ Params() login.Params }

// PathsStatus implements status.PathsProvider.
func (d *Device) PathsStatus() []status.Path {
	transport := "tcp"
	if strings.HasPrefix(d.info.URL, "iser://") {
		transport = "iser"
	}
	stats := d.PathStats()
	out := make([]status.Path, len(stats))
	for i, st := range stats {
		p := status.Path{Portal: st.Portal, Transport: transport, State: pathStatusState(st), ALUAState: st.ALUA,
			NopRoundTrip: d.paths[i].nop.status(),
			Reconnects:   st.Restores, Replayed: st.Replayed, Aborts: st.Aborts, LUNResets: st.LUNResets}
		if pr, ok := d.paths[i].ex.(paramsReporter); ok {
			p.Negotiated = negotiated(pr.Params())
		}
		out[i] = p
	}
	return out
}

func pathStatusState(st PathStats) string {
	switch {
	case !st.Up:
		return "down"
	case st.ALUA == "standby":
		return "standby"
	}
	return "up"
}

// negotiated maps login's Params to the status schema (RFC 7143 §13; iSER RFC 7145 §6).
func negotiated(p login.Params) status.Negotiated {
	digest := func(on bool) string {
		if on {
			return "CRC32C"
		}
		return "None"
	}
	return status.Negotiated{
		MaxRecvDataSegmentLengthInitiator: p.MaxRecvDataSegmentLength,
		MaxRecvDataSegmentLengthTarget:    p.TargetMaxRecvDataSegmentLength,
		MaxBurstLength:                    p.MaxBurstLength,
		FirstBurstLength:                  p.FirstBurstLength,
		ImmediateData:                     p.ImmediateData,
		InitialR2T:                        p.InitialR2T,
		HeaderDigest:                      digest(p.HeaderDigest),
		DataDigest:                        digest(p.DataDigest),
		CommandWindow:                     p.MaxCmdSN - p.ExpCmdSN + 1,
		RDMAExtensions:                    p.Extra["RDMAExtensions"] == "Yes",
	}
}

// LUNStatus implements status.LUNProvider.
func (d *Device) LUNStatus() status.LUN {
	l := d.limits
	if !l.CanDiscard {
		l.MaxDiscard, l.DiscardAlignment = 0, 0
	}
	var target string
	if t, err := ParseURL(d.info.URL); err == nil { // "" for a NewDevice: no URL
		target = t.IQN
	}
	return status.LUN{
		TargetName:            target,
		Number:                d.info.LUN,
		WWN:                   d.info.WWN,
		SizeBytes:             uint64(d.size),
		BlockSize:             d.info.LogicalBlockSize,
		Vendor:                d.info.Vendor,
		Product:               d.info.Product,
		MaxTransferBytes:      uint64(max(l.MaxTransfer, 0)),
		OptimalTransferBytes:  uint64(max(l.OptimalTransfer, 0)),
		MaxUnmapBytes:         uint64(max(l.MaxDiscard, 0)),
		UnmapGranularityBytes: uint64(max(l.DiscardAlignment, 0)),
		MaxWriteSameBytes:     uint64(max(l.MaxWriteZeroes, 0)),
	}
}

// ReplacementStatus implements status.ReplacementProvider: the replacement timeout and, while
// no path is up, how long I/O has been waiting for one (what waitPath counts from).
func (d *Device) ReplacementStatus() status.Replacement {
	r := status.Replacement{TimeoutSeconds: d.rec.ReplacementTimeout.Seconds()}
	d.state.mu.Lock()
	since := d.state.downSince
	d.state.mu.Unlock()
	if !since.IsZero() && !d.anyUp() {
		r.NoPathSeconds = time.Since(since).Seconds()
	}
	return r
}

// RDMAStatus implements status.RDMAProvider: the process's verbs counters (internal/rdma), for
// a device with an iSER path; nil over TCP.
func (d *Device) RDMAStatus() *status.RDMA {
	if !strings.HasPrefix(d.info.URL, "iser://") {
		return nil
	}
	c := rdma.Stats()
	return &status.RDMA{
		SendPosts: uint64(c.SendPosts), SendWorkRequests: uint64(c.SendWRs),
		RecvPosts: uint64(c.RecvPosts), RecvWorkRequests: uint64(c.RecvWRs),
		Completions: uint64(c.Completions), CompletionEvents: uint64(c.CQEvents),
		MissedCompletionEvents: uint64(c.CQEventsMissed),
	}
}
