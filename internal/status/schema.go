// Package status is the one source of truth for what a running gateway reports: the status
// schema (version 1, stable snake_case JSON names, documented in docs/operations.md), the
// Providers each layer implements to fill its part, the Registry that assembles a Status from
// them, and IOCounters, the allocation-free per-operation counters the data path keeps.
//
// `iser-blk status`, `iser-blk list` and the Prometheus collector all read a Status built by
// Registry.Snapshot; none of them counts anything itself. A field is added, never renamed or
// re-typed, within one Version.
package status

import (
	"time"

	"github.com/iser-blk/iser-blk/internal/modes"
)

// Version is the schema version every Status carries; it changes only when a field is renamed,
// re-typed or removed.
const Version = 1

// Status is everything a gateway reports about itself.
type Status struct {
	Version int     `json:"version"`
	Gateway Gateway `json:"gateway"`
	Paths   []Path  `json:"paths"`
	// Replacement is the backend's replacement-timeout clock; omitted when the backend has none.
	Replacement *Replacement `json:"replacement,omitempty"`
	// RDMA is the verbs work of the gateway's iSER connections; omitted without an iSER path.
	RDMA     *RDMA     `json:"rdma,omitempty"`
	LUN      *LUN      `json:"lun,omitempty"`
	Frontend *Frontend `json:"frontend,omitempty"`
	Cache    *Cache    `json:"cache,omitempty"`
	IO       IO        `json:"io"`
}

// Gateway identifies the process and says what it serves. It is what `iser-blk list` prints.
type Gateway struct {
	Name          string         `json:"name"`
	PID           int            `json:"pid"`
	Device        string         `json:"device"`        // the metrics' device label: nbd0, ublkb3, or the socket (DeviceLabel)
	FrontendKind  modes.Frontend `json:"frontend_kind"` // "nbd-socket", "nbd" (kernel) or "ublk"
	FrontendPath  string         `json:"frontend_path"` // the NBD socket, /dev/nbdX or /dev/ublkbN
	Targets       []string       `json:"targets"`       // target URLs, never with credentials
	CacheMode     modes.Cache    `json:"cache_mode"`    // as --cache: "writeback", "writethrough" or "off"
	State         string         `json:"state"`         // a lifecycle state
	StateReason   string         `json:"state_reason,omitempty"`
	Fenced        bool           `json:"fenced"` // failed because the device is fenced (FencedReason): every I/O fails until detached
	StartedAt     time.Time      `json:"started_at"`
	UptimeSeconds float64        `json:"uptime_seconds"`
	BuildVersion  string         `json:"build_version"`
}

// Path is one iSCSI session (one portal) to the target.
type Path struct {
	Portal       string     `json:"portal"`     // host:port
	Transport    string     `json:"transport"`  // "tcp" or "iser"
	State        string     `json:"state"`      // "up", "recovering", "down" or "standby"
	ALUAState    string     `json:"alua_state"` // SPC-4 asymmetric access state, e.g. "active/optimized"; "" if not reported
	Negotiated   Negotiated `json:"negotiated"`
	NopRoundTrip NopRTT     `json:"nop_round_trip"`
	Reconnects   uint64     `json:"reconnects"`
	Replayed     uint64     `json:"replayed_commands"` // commands re-sent after a reconnect
	Aborts       uint64     `json:"aborts"`            // ABORT TASK task-management functions sent
	LUNResets    uint64     `json:"lun_resets"`        // LOGICAL UNIT RESET task-management functions sent
}

// PathStates are the values of Path.State, in the order the metrics' path_state lists them.
var PathStates = []string{"up", "recovering", "down", "standby"}

// Up reports whether the path carries I/O; the metrics' path_up.
func (p Path) Up() bool { return p.State == "up" }

// Replacement is how long I/O has waited for a path, against how long it may (RFC 7143 has
// no name for it; open-iscsi's replacement_timeout): at TimeoutSeconds without a path, I/O fails
// and the gateway is failed.
type Replacement struct {
	TimeoutSeconds float64 `json:"timeout_seconds"` // --replacement-timeout; negative: I/O waits forever
	NoPathSeconds  float64 `json:"no_path_seconds"` // since the last path went down; 0 while one is up
}

// RDMA counts the verbs work of the process's iSER connections since it started (one gateway per
// process), every connection and path together. Per I/O they tell how well work is batched:
// work requests per post (one post is one doorbell; on soft-RoCE one system call), signalled
// work requests (completions), and how often a completion poller slept and was woken (events).
type RDMA struct {
	SendPosts              uint64 `json:"send_posts"`               // ibv_post_send calls
	SendWorkRequests       uint64 `json:"send_work_requests"`       // the send work requests they carried
	RecvPosts              uint64 `json:"recv_posts"`               // ibv_post_recv calls
	RecvWorkRequests       uint64 `json:"recv_work_requests"`       // the receive work requests they carried
	Completions            uint64 `json:"completions"`              // work completions polled
	CompletionEvents       uint64 `json:"completion_events"`        // completion-channel events: a poller woken
	MissedCompletionEvents uint64 `json:"missed_completion_events"` // completions found by a safety poll with no event queued
}

// Negotiated is the outcome of login negotiation on a path (RFC 7143 §13; iSER: RFC 7145 §6).
type Negotiated struct {
	// MaxRecvDataSegmentLength declared by the initiator (the most the target may send us) and
	// by the target (the most we may send it); RFC 7143 §13.12 — each direction is separate.
	MaxRecvDataSegmentLengthInitiator uint32 `json:"max_recv_data_segment_length_initiator"`
	MaxRecvDataSegmentLengthTarget    uint32 `json:"max_recv_data_segment_length_target"`
	MaxBurstLength                    uint32 `json:"max_burst_length"`
	FirstBurstLength                  uint32 `json:"first_burst_length"`
	ImmediateData                     bool   `json:"immediate_data"`
	InitialR2T                        bool   `json:"initial_r2t"`
	HeaderDigest                      string `json:"header_digest"` // "None" or "CRC32C"
	DataDigest                        string `json:"data_digest"`
	CommandWindow                     uint32 `json:"command_window"` // MaxCmdSN − ExpCmdSN + 1 when sampled
	RDMAExtensions                    bool   `json:"iser_rdma_extensions"`
}

// NopRTT is the NOP-Out/NOP-In round trip (RFC 7143 §11.18) of a path. Before the first
// answered ping Samples is 0 and the times are 0 too, which means "no sample", not "no time".
type NopRTT struct {
	LastSeconds float64 `json:"last_seconds"`
	MeanSeconds float64 `json:"mean_seconds"`
	Samples     uint64  `json:"samples"`
}

// LUN is what the target reported about the logical unit.
type LUN struct {
	TargetName            string `json:"target_name"` // the target's iSCSI name (IQN), "" when not known
	Number                uint16 `json:"number"`      // the logical unit number
	WWN                   string `json:"wwn"`         // the preferred designator of VPD page 0x83, as `info` prints it; "" if none
	SizeBytes             uint64 `json:"size_bytes"`
	BlockSize             uint32 `json:"block_size"`
	Vendor                string `json:"vendor"`
	Product               string `json:"product"`
	MaxTransferBytes      uint64 `json:"max_transfer_bytes"`      // Block Limits VPD; 0 = no limit reported
	OptimalTransferBytes  uint64 `json:"optimal_transfer_bytes"`  // 0 = not reported
	MaxUnmapBytes         uint64 `json:"max_unmap_bytes"`         // 0 = UNMAP not supported
	UnmapGranularityBytes uint64 `json:"unmap_granularity_bytes"` // 0 = not reported
	MaxWriteSameBytes     uint64 `json:"max_write_same_bytes"`    // 0 = not reported
}

// Frontend is the client-facing side: NBD connections or ublk queues.
type Frontend struct {
	Kind        modes.Frontend `json:"kind"`        // as Gateway.FrontendKind
	Connections int            `json:"connections"` // NBD: open client connections
	Queues      int            `json:"queues"`      // ublk: hardware queues; NBD kernel: sockets
	QueueDepth  int            `json:"queue_depth"`
}

// Cache is the cache layer's state. Counters are totals since start.
type Cache struct {
	Mode               string     `json:"mode"`
	CapacityBytes      uint64     `json:"capacity_bytes"`
	UsedBytes          uint64     `json:"used_bytes"`
	DirtyBytes         uint64     `json:"dirty_bytes"`
	DirtyLimitBytes    uint64     `json:"dirty_limit_bytes"` // --cache-dirty: writers wait above it
	Hits               uint64     `json:"hits"`
	Misses             uint64     `json:"misses"`
	HitRatio           float64    `json:"hit_ratio"` // hits/(hits+misses), 0 before the first read
	WrittenBackBytes   uint64     `json:"written_back_bytes"`
	ThrottledSeconds   float64    `json:"throttled_seconds"` // time writers waited for dirty space
	WriteBackErrors    uint64     `json:"write_back_errors"` // write-backs that failed (each kept its data dirty)
	LastWriteBackError string     `json:"last_write_back_error,omitempty"`
	LastWriteBackAt    *time.Time `json:"last_write_back_error_at,omitempty"`
	// Device is the persistent write-back log under the RAM cache (--cache-dev), when there is
	// one: the RAM cache then writes through to it, and it holds the dirty data.
	Device *CacheDevice `json:"device,omitempty"`
}

// CacheDevice is the state of a --cache-dev log (cache/journal).
type CacheDevice struct {
	Path             string `json:"path"`
	CapacityBytes    uint64 `json:"capacity_bytes"`     // the log's ring
	LogBytes         uint64 `json:"log_bytes"`          // ring in use: not yet written back, with superseded copies and headers
	DirtyBytes       uint64 `json:"dirty_bytes"`        // data the target does not have yet
	IndexMemoryBytes uint64 `json:"index_memory_bytes"` // RAM the log's index takes
	WrittenBackBytes uint64 `json:"written_back_bytes"` // since the gateway started
	WriteBackErrors  uint64 `json:"write_back_errors"`  // write-back rounds that failed (retried; the data stays)
	Syncs            uint64 `json:"syncs"`              // fdatasyncs of the cache device (FLUSH, FUA)
	Failed           string `json:"failed,omitempty"`   // why the cache device failed: writes and flushes fail
}

// SetHitRatio fills HitRatio from Hits and Misses; a provider calls it so that every reader
// sees the same ratio.
func (c *Cache) SetHitRatio() {
	if total := c.Hits + c.Misses; total > 0 {
		c.HitRatio = float64(c.Hits) / float64(total)
	} else {
		c.HitRatio = 0
	}
}

// IO is the per-operation counters as the frontend saw them (what the client asked for).
type IO struct {
	InFlight int64     `json:"in_flight"`
	Ops      []OpStats `json:"ops"`
}

// OpStats is one operation's counters.
type OpStats struct {
	Op       string    `json:"op"` // "read", "write", "flush", "trim", "write_zeroes"
	Requests uint64    `json:"requests"`
	Errors   uint64    `json:"errors"`
	Bytes    uint64    `json:"bytes"`
	Duration Histogram `json:"duration_seconds"`
}

// Histogram is a cumulative histogram in Prometheus' shape: Buckets[i].Count counts the
// observations ≤ Buckets[i].UpperBound; Count includes those above the last bound (+Inf).
type Histogram struct {
	Count      uint64   `json:"count"`
	SumSeconds float64  `json:"sum_seconds"`
	Buckets    []Bucket `json:"buckets"`
}

// Bucket is one cumulative histogram bucket.
type Bucket struct {
	UpperBound float64 `json:"le"` // seconds
	Count      uint64  `json:"count"`
}
