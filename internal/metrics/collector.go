// Package metrics exports a gateway's status snapshot to Prometheus (docs/operations.md,
// "Metrics"). The Collector reads one status.Status per scrape and turns its fields into
// metrics one to one: it keeps no counters and computes nothing the snapshot does not hold, so
// `iser-blk status` and /metrics can never disagree about a number.
//
// Naming follows Prometheus: the iser_blk_ prefix, base units (bytes, seconds) in the name,
// _total on counters. Every series carries the gateway's name and device as constant labels.
package metrics

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/status"
)

const namespace = "iser_blk"

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(namespace+"_"+name, help, labels, nil)
}

// The metrics. Their names and labels are documented in docs/operations.md; a change here is a
// change for every dashboard.
var (
	buildInfo       = desc("build_info", "Build of the running gateway; always 1.", "version", "goversion")
	gatewayState    = desc("gateway_state", "1 for the gateway's current lifecycle state, 0 for the others.", "state")
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
	cacheHits       = desc("cache_hits_total", "Reads answered from the cache.")
	cacheMisses     = desc("cache_misses_total", "Reads that went to the target.")
	writtenBack     = desc("cache_written_back_bytes_total", "Bytes written back from the cache to the target.")
	throttled       = desc("cache_throttled_seconds_total", "Time client writes waited for dirty space.")
	pathUp          = desc("path_up", "1 if the path to the portal carries I/O, else 0.", "portal", "transport", "state")
	reconnects      = desc("path_reconnects_total", "Reconnects of the path after a connection loss.", "portal")
	replayed        = desc("path_replayed_commands_total", "Commands re-sent on the path after a reconnect.", "portal")
	taskManagement  = desc("path_task_management_functions_total", "Task-management functions sent on the path, by kind.", "portal", "kind")
	nopRoundTrip    = desc("path_nop_round_trip_seconds", "Last NOP-Out/NOP-In round trip on the path.", "portal")
	allDescs        = []*prometheus.Desc{buildInfo, gatewayState, startTime, requests, requestErrors,
		requestDuration, readBytes, writtenBytes, inFlight, lunSize, cacheCapacity, cacheUsed,
		cacheDirty, cacheHits, cacheMisses, writtenBack, throttled, pathUp, reconnects, replayed,
		taskManagement, nopRoundTrip}
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
	collectGateway(ch, st.Gateway)
	collectIO(ch, st.IO)
	if st.LUN != nil {
		gauge(ch, lunSize, float64(st.LUN.SizeBytes))
	}
	if st.Cache != nil {
		collectCache(ch, st.Cache)
	}
	for _, p := range st.Paths {
		collectPath(ch, p)
	}
}

func collectGateway(ch chan<- prometheus.Metric, g status.Gateway) {
	gauge(ch, buildInfo, 1, g.BuildVersion, runtime.Version())
	for _, s := range lifecycle.States {
		v := 0.0
		if string(s) == g.State {
			v = 1
		}
		gauge(ch, gatewayState, v, string(s))
	}
	gauge(ch, startTime, float64(g.StartedAt.UnixNano())/1e9)
}

func collectIO(ch chan<- prometheus.Metric, io status.IO) {
	gauge(ch, inFlight, float64(io.InFlight))
	for _, op := range io.Ops {
		counter(ch, requests, float64(op.Requests), op.Op)
		counter(ch, requestErrors, float64(op.Errors), op.Op)
		buckets := make(map[float64]uint64, len(op.Duration.Buckets))
		for _, b := range op.Duration.Buckets {
			buckets[b.UpperBound] = b.Count
		}
		ch <- prometheus.MustNewConstHistogram(requestDuration, op.Duration.Count, op.Duration.SumSeconds, buckets, op.Op)
		switch op.Op {
		case status.OpRead.String():
			counter(ch, readBytes, float64(op.Bytes))
		case status.OpWrite.String():
			counter(ch, writtenBytes, float64(op.Bytes))
		}
	}
}

func collectCache(ch chan<- prometheus.Metric, c *status.Cache) {
	gauge(ch, cacheCapacity, float64(c.CapacityBytes))
	gauge(ch, cacheUsed, float64(c.UsedBytes))
	gauge(ch, cacheDirty, float64(c.DirtyBytes))
	counter(ch, cacheHits, float64(c.Hits))
	counter(ch, cacheMisses, float64(c.Misses))
	counter(ch, writtenBack, float64(c.WrittenBackBytes))
	counter(ch, throttled, c.ThrottledSeconds)
}

func collectPath(ch chan<- prometheus.Metric, p status.Path) {
	up := 0.0
	if p.Up() {
		up = 1
	}
	gauge(ch, pathUp, up, p.Portal, p.Transport, p.State)
	counter(ch, reconnects, float64(p.Reconnects), p.Portal)
	counter(ch, replayed, float64(p.Replayed), p.Portal)
	counter(ch, taskManagement, float64(p.Aborts), p.Portal, "abort_task")
	counter(ch, taskManagement, float64(p.LUNResets), p.Portal, "lun_reset")
	gauge(ch, nopRoundTrip, p.NopRoundTrip.LastSeconds, p.Portal)
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
}
