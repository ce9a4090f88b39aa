// Package metrics exports a gateway's status snapshot to Prometheus (docs/operations.md,
// "Metrics"). The Collector reads one status.Status per scrape and turns its fields into
// metrics one to one: it keeps no counters and computes nothing the snapshot does not hold, so
// `iser-blk status` and /metrics can never disagree about a number.
//
// Naming follows Prometheus: the iser_blk_ prefix, base units (bytes, seconds) in the name,
// _total on counters. Every series carries the gateway's name and its device (status.DeviceLabel:
// nbd0, ublkb3, or the socket), read from each snapshot, so that the series join node_exporter's
// node_disk_*{device} and a device created after the gateway started is named once it exists.
//
// Cost: the data path only bumps the atomics the snapshot reads (status.IOCounters and each
// layer's own); everything here runs per scrape, never per I/O.
package metrics

import (
	"runtime"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/status"
)

const namespace = "iser_blk"

// gatewayLabels come first on every family: the gateway's name and device.
var gatewayLabels = []string{"name", "device"}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(namespace+"_"+name, help, append(append([]string{}, gatewayLabels...), labels...), nil)
}

// The metrics. Their names and labels are documented in docs/operations.md; a change here is a
// change for every dashboard.
var (
	buildInfo       = desc("build_info", "Build of the running gateway; always 1.", "version", "goversion")
	gatewayInfo     = desc("gateway_info", "What the gateway serves, once the LUN is probed; always 1.", "target", "lun", "wwn", "version")
	gatewayState    = desc("gateway_state", "1 for the gateway's current lifecycle state, 0 for the others.", "state")
	gatewayFenced   = desc("gateway_fenced", "1 while the gateway's device is fenced (a takeover of dirty write-back data: every I/O fails until it is detached), else 0.")
	startTime       = desc("start_time_seconds", "When the gateway started, Unix time.")
	requests        = desc("requests_total", "Client requests completed, by operation.", "op")
	requestErrors   = desc("request_errors_total", "Client requests answered with an error, by operation.", "op")
	requestDuration = desc("request_duration_seconds", "Time from a client request's arrival to its answer, by operation.", "op")
	readBytes       = desc("read_bytes_total", "Bytes returned to clients by successful reads.")
	writtenBytes    = desc("written_bytes_total", "Bytes accepted from clients by successful writes.")
	inFlight        = desc("requests_in_flight", "Client requests received and not yet answered.")
	lunSize         = desc("lun_size_bytes", "Size of the target's logical unit.")
	cacheCapacity   = desc("cache_capacity_bytes", "Cache capacity.")
	cacheUsed       = desc("cache_used_bytes", "Cache bytes holding data.")
	cacheDirty      = desc("cache_dirty_bytes", "Cache bytes written by clients and not yet written back to the target.")
	cacheDirtyLimit = desc("cache_dirty_limit_bytes", "Dirty bytes above which client writes wait for write-back (--cache-dirty).")
	cacheHits       = desc("cache_hits_total", "Reads answered from the cache.")
	cacheMisses     = desc("cache_misses_total", "Reads that went to the target.")
	writtenBack     = desc("cache_written_back_bytes_total", "Bytes written back from the cache to the target.")
	devCapacity     = desc("cache_device_capacity_bytes", "Size of the --cache-dev log's ring.")
	devLog          = desc("cache_device_log_bytes", "Bytes of the --cache-dev log not yet written back (data, superseded copies, headers).")
	devDirty        = desc("cache_device_dirty_bytes", "Data on the --cache-dev log that the target does not have yet.")
	devWrittenBack  = desc("cache_device_written_back_bytes_total", "Bytes written back from the --cache-dev log to the target.")
	devErrors       = desc("cache_device_write_back_errors_total", "Write-back rounds of the --cache-dev log that failed (retried; the data stays).")
	devFailed       = desc("cache_device_failed", "1 once the --cache-dev device failed a write or a sync: writes and flushes fail until restart.")
	throttled       = desc("cache_throttled_seconds_total", "Time client writes waited for dirty space.")
	writeBackErrors = desc("cache_write_back_errors_total", "Write-backs to the target that failed; their data stays dirty and the next flush fails.")
	pathUp          = desc("path_up", "1 if the path to the portal carries I/O, else 0.", "portal", "transport")
	pathState       = desc("path_state", "1 for the path's current state (up, recovering, down, standby), 0 for the others.", "portal", "transport", "state")
	reconnects      = desc("path_reconnects_total", "Reconnects of the path after a connection loss.", "portal")
	replayed        = desc("path_replayed_commands_total", "Commands re-sent on the path after a reconnect.", "portal")
	taskManagement  = desc("path_task_management_functions_total", "Task-management functions sent on the path, by kind.", "portal", "kind")
	replTimeout     = desc("replacement_timeout_seconds", "How long I/O waits without a path before it fails (--replacement-timeout); negative: forever.")
	noPath          = desc("no_path_seconds", "How long every path has been down; 0 while one is up.")
	nopRoundTrip    = desc("path_nop_round_trip_seconds", "Last NOP-Out/NOP-In round trip on the path; absent before the first answered ping.", "portal")
	rdmaPosts       = desc("rdma_posts_total", "ibv_post_send and ibv_post_recv calls of the iSER connections, by queue (send, recv); iSER only.", "queue")
	rdmaWRs         = desc("rdma_work_requests_total", "Work requests those posts carried, by queue (send, recv); iSER only.", "queue")
	rdmaCompletions = desc("rdma_completions_total", "Work completions polled from the iSER connections' completion queues; iSER only.")
	rdmaEvents      = desc("rdma_completion_events_total", "Completion-channel events taken: a completion poller woken by the device; iSER only.")
	allDescs        = []*prometheus.Desc{buildInfo, gatewayInfo, gatewayState, gatewayFenced, startTime,
		requests, requestErrors, requestDuration, readBytes, writtenBytes, inFlight, lunSize,
		cacheCapacity, cacheUsed, cacheDirty, cacheDirtyLimit, cacheHits, cacheMisses, writtenBack,
		throttled, writeBackErrors, pathUp, pathState, replTimeout, noPath, reconnects, replayed,
		taskManagement, nopRoundTrip, rdmaPosts, rdmaWRs, rdmaCompletions, rdmaEvents}
)

// Collector is a prometheus.Collector over a status source.
type Collector struct {
	snapshot func() status.Status
}

// NewCollector returns a Collector that calls snapshot once per scrape (status.Registry's
// Snapshot).
func NewCollector(snapshot func() status.Status) *Collector {
	return &Collector{snapshot: snapshot}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.snapshot()
	e := emitter{ch: ch, gw: []string{st.Gateway.Name, st.Gateway.Device}}
	e.gateway(st.Gateway)
	e.io(st.IO)
	if st.LUN != nil {
		e.gauge(gatewayInfo, 1, st.LUN.TargetName, strconv.FormatUint(uint64(st.LUN.Number), 10), st.LUN.WWN, st.Gateway.BuildVersion)
		e.gauge(lunSize, float64(st.LUN.SizeBytes))
	}
	if st.Cache != nil {
		e.cache(st.Cache)
	}
	for _, p := range st.Paths {
		e.path(p)
	}
	if r := st.Replacement; r != nil {
		e.gauge(replTimeout, r.TimeoutSeconds)
		e.gauge(noPath, r.NoPathSeconds)
	}
	if r := st.RDMA; r != nil {
		e.rdma(r)
	}
}

// emitter sends one scrape's metrics, each with the gateway's labels first.
type emitter struct {
	ch chan<- prometheus.Metric
	gw []string // name, device
}

func (e emitter) gateway(g status.Gateway) {
	e.gauge(buildInfo, 1, g.BuildVersion, runtime.Version())
	for _, s := range lifecycle.States {
		e.gauge(gatewayState, oneIf(string(s) == g.State), string(s))
	}
	e.gauge(gatewayFenced, oneIf(g.Fenced))
	e.gauge(startTime, float64(g.StartedAt.UnixNano())/1e9)
}

func (e emitter) io(io status.IO) {
	e.gauge(inFlight, float64(io.InFlight))
	for _, op := range io.Ops {
		e.counter(requests, float64(op.Requests), op.Op)
		e.counter(requestErrors, float64(op.Errors), op.Op)
		buckets := make(map[float64]uint64, len(op.Duration.Buckets))
		for _, b := range op.Duration.Buckets {
			buckets[b.UpperBound] = b.Count
		}
		e.ch <- prometheus.MustNewConstHistogram(requestDuration, op.Duration.Count, op.Duration.SumSeconds, buckets, e.labels(op.Op)...)
		switch op.Op {
		case status.OpRead.String():
			e.counter(readBytes, float64(op.Bytes))
		case status.OpWrite.String():
			e.counter(writtenBytes, float64(op.Bytes))
		}
	}
}

func (e emitter) cache(c *status.Cache) {
	e.gauge(cacheCapacity, float64(c.CapacityBytes))
	e.gauge(cacheUsed, float64(c.UsedBytes))
	e.gauge(cacheDirty, float64(c.DirtyBytes))
	e.gauge(cacheDirtyLimit, float64(c.DirtyLimitBytes))
	e.counter(cacheHits, float64(c.Hits))
	e.counter(cacheMisses, float64(c.Misses))
	e.counter(writtenBack, float64(c.WrittenBackBytes))
	e.counter(throttled, c.ThrottledSeconds)
	e.counter(writeBackErrors, float64(c.WriteBackErrors))
	if d := c.Device; d != nil {
		e.gauge(devCapacity, float64(d.CapacityBytes))
		e.gauge(devLog, float64(d.LogBytes))
		e.gauge(devDirty, float64(d.DirtyBytes))
		e.counter(devWrittenBack, float64(d.WrittenBackBytes))
		e.counter(devErrors, float64(d.WriteBackErrors))
		e.gauge(devFailed, oneIf(d.Failed != ""))
	}
}

func (e emitter) path(p status.Path) {
	e.gauge(pathUp, oneIf(p.Up()), p.Portal, p.Transport)
	for _, s := range status.PathStates {
		e.gauge(pathState, oneIf(p.State == s), p.Portal, p.Transport, s)
	}
	e.counter(reconnects, float64(p.Reconnects), p.Portal)
	e.counter(replayed, float64(p.Replayed), p.Portal)
	e.counter(taskManagement, float64(p.Aborts), p.Portal, "abort_task")
	e.counter(taskManagement, float64(p.LUNResets), p.Portal, "lun_reset")
	if p.NopRoundTrip.Samples > 0 { // no sample is no value, not a round trip of 0 s
		e.gauge(nopRoundTrip, p.NopRoundTrip.LastSeconds, p.Portal)
	}
}

func (e emitter) rdma(r *status.RDMA) {
	e.counter(rdmaPosts, float64(r.SendPosts), "send")
	e.counter(rdmaPosts, float64(r.RecvPosts), "recv")
	e.counter(rdmaWRs, float64(r.SendWorkRequests), "send")
	e.counter(rdmaWRs, float64(r.RecvWorkRequests), "recv")
	e.counter(rdmaCompletions, float64(r.Completions))
	e.counter(rdmaEvents, float64(r.CompletionEvents))
}

func (e emitter) labels(values ...string) []string {
	return append(append(make([]string, 0, len(e.gw)+len(values)), e.gw...), values...)
}

func (e emitter) gauge(d *prometheus.Desc, v float64, labels ...string) {
	e.ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, e.labels(labels...)...)
}

func (e emitter) counter(d *prometheus.Desc, v float64, labels ...string) {
	e.ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, e.labels(labels...)...)
}

func oneIf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
