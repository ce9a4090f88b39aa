package metrics

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/status"
)

// layers stands in for the gateway's layers: real IOCounters, fixed cache, LUN and paths.
type layers struct{ status.IOCounters }

func (*layers) PathsStatus() []status.Path {
	return []status.Path{
		{Portal: "10.0.0.1:3260", Transport: "iser", State: "up", Reconnects: 3, Replayed: 17,
			Aborts: 2, LUNResets: 1, NopRoundTrip: status.NopRTT{LastSeconds: 0.00025, MeanSeconds: 0.0002, Samples: 4}},
		{Portal: "10.0.0.2:3260", Transport: "tcp", State: "recovering"},
	}
}
func (*layers) ReplacementStatus() status.Replacement {
	return status.Replacement{TimeoutSeconds: 120, NoPathSeconds: 0}
}
func (*layers) RDMAStatus() *status.RDMA {
	return &status.RDMA{SendPosts: 40, SendWorkRequests: 100, RecvPosts: 5, RecvWorkRequests: 80, Completions: 150, CompletionEvents: 30}
}
func (*layers) LUNStatus() status.LUN {
	return status.LUN{TargetName: "iqn.2003-01.org.example:disk", Number: 3, WWN: "naa.60014050deadbeef0000000000000001",
		SizeBytes: 8 << 30, BlockSize: 4096}
}
func (*layers) CacheStatus() status.Cache {
	return status.Cache{Mode: "writeback", CapacityBytes: 1 << 30, UsedBytes: 5 << 20, DirtyBytes: 1 << 20, DirtyLimitBytes: 512 << 20,
		Hits: 90, Misses: 10, WrittenBackBytes: 123456, ThrottledSeconds: 1.5, WriteBackErrors: 7}
}

func newSource(t *testing.T) (*status.Registry, *layers) {
	t.Helper()
	lm := lifecycle.New()
	if err := lm.To(lifecycle.Ready, ""); err != nil {
		t.Fatal(err)
	}
	// Named gw, its device /dev/nbd0: the device label is the kernel's name, not the gateway's.
	reg := status.NewRegistry(status.Identity{Name: "gw", Device: "gw", FrontendKind: "nbd", FrontendPath: "/dev/nbd0",
		BuildVersion: "1.2.3"}, lm)
	l := &layers{}
	reg.SetIO(l)
	reg.SetLUN(l)
	reg.SetCache(l)
	reg.SetPaths(l)
	for i := 0; i < 5; i++ {
		l.Op(status.OpRead).Observe(4096, time.Duration(i)*40*time.Microsecond, false)
	}
	l.Op(status.OpWrite).Observe(1<<20, 3*time.Millisecond, false)
	l.Op(status.OpWrite).Observe(1<<20, 20*time.Second, true)
	l.Begin()
	return reg, l
}

func scrape(t *testing.T, reg *status.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	preg, err := NewRegistry(reg.Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := Listen("127.0.0.1:0", preg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	resp, err := http.Get("http://" + srv.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// find returns the metric of family name whose labels include want.
func find(t *testing.T, mfs map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	t.Helper()
	mf, ok := mfs[name]
	if !ok {
		t.Fatalf("no family %s", name)
	}
next:
	for _, m := range mf.Metric {
		got := map[string]string{}
		for _, lp := range m.Label {
			got[lp.GetName()] = lp.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		return m
	}
	t.Fatalf("%s has no series with %v", name, want)
	return nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return -1
}

func TestScrapeEqualsSnapshot(t *testing.T) {
	reg, _ := newSource(t)
	mfs := scrape(t, reg)
	st := reg.Snapshot()
	read, write := st.IO.Ops[status.OpRead], st.IO.Ops[status.OpWrite]
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"iser_blk_requests_total", map[string]string{"op": "read"}, float64(read.Requests)},
		{"iser_blk_requests_total", map[string]string{"op": "write"}, float64(write.Requests)},
		{"iser_blk_request_errors_total", map[string]string{"op": "write"}, float64(write.Errors)},
		{"iser_blk_read_bytes_total", nil, float64(read.Bytes)},
		{"iser_blk_written_bytes_total", nil, float64(write.Bytes)},
		{"iser_blk_requests_in_flight", nil, 1},
		{"iser_blk_lun_size_bytes", nil, 8 << 30},
		{"iser_blk_cache_capacity_bytes", nil, 1 << 30},
		{"iser_blk_cache_used_bytes", nil, 5 << 20},
		{"iser_blk_cache_dirty_bytes", nil, 1 << 20},
		{"iser_blk_cache_hits_total", nil, 90},
		{"iser_blk_cache_misses_total", nil, 10},
		{"iser_blk_cache_written_back_bytes_total", nil, 123456},
		{"iser_blk_cache_throttled_seconds_total", nil, 1.5},
		{"iser_blk_cache_write_back_errors_total", nil, 7},
		{"iser_blk_cache_dirty_limit_bytes", nil, 512 << 20},
		{"iser_blk_replacement_timeout_seconds", nil, 120},
		{"iser_blk_no_path_seconds", nil, 0},
		{"iser_blk_gateway_fenced", nil, 0},
		{"iser_blk_path_up", map[string]string{"portal": "10.0.0.1:3260", "transport": "iser"}, 1},
		{"iser_blk_path_up", map[string]string{"portal": "10.0.0.2:3260", "transport": "tcp"}, 0},
		{"iser_blk_path_state", map[string]string{"portal": "10.0.0.1:3260", "transport": "iser", "state": "up"}, 1},
		{"iser_blk_path_state", map[string]string{"portal": "10.0.0.1:3260", "transport": "iser", "state": "recovering"}, 0},
		{"iser_blk_path_state", map[string]string{"portal": "10.0.0.2:3260", "transport": "tcp", "state": "recovering"}, 1},
		{"iser_blk_path_state", map[string]string{"portal": "10.0.0.2:3260", "transport": "tcp", "state": "up"}, 0},
		{"iser_blk_path_state", map[string]string{"portal": "10.0.0.2:3260", "transport": "tcp", "state": "standby"}, 0},
		{"iser_blk_path_reconnects_total", map[string]string{"portal": "10.0.0.1:3260"}, 3},
		{"iser_blk_path_replayed_commands_total", map[string]string{"portal": "10.0.0.1:3260"}, 17},
		{"iser_blk_path_task_management_functions_total", map[string]string{"portal": "10.0.0.1:3260", "kind": "abort_task"}, 2},
		{"iser_blk_path_task_management_functions_total", map[string]string{"portal": "10.0.0.1:3260", "kind": "lun_reset"}, 1},
		{"iser_blk_path_nop_round_trip_seconds", map[string]string{"portal": "10.0.0.1:3260"}, 0.00025},
		{"iser_blk_gateway_state", map[string]string{"state": "ready"}, 1},
		{"iser_blk_gateway_state", map[string]string{"state": "flushing"}, 0},
		{"iser_blk_build_info", map[string]string{"version": "1.2.3"}, 1},
		{"iser_blk_gateway_info", map[string]string{"target": "iqn.2003-01.org.example:disk", "lun": "3",
			"wwn": "naa.60014050deadbeef0000000000000001", "version": "1.2.3"}, 1},
		{"iser_blk_start_time_seconds", nil, float64(st.Gateway.StartedAt.UnixNano()) / 1e9},
		{"iser_blk_rdma_posts_total", map[string]string{"queue": "send"}, 40},
		{"iser_blk_rdma_posts_total", map[string]string{"queue": "recv"}, 5},
		{"iser_blk_rdma_work_requests_total", map[string]string{"queue": "send"}, 100},
		{"iser_blk_rdma_work_requests_total", map[string]string{"queue": "recv"}, 80},
		{"iser_blk_rdma_completions_total", nil, 150},
		{"iser_blk_rdma_completion_events_total", nil, 30},
	}
	for _, c := range checks {
		labels := map[string]string{"name": "gw", "device": "nbd0"}
		for k, v := range c.labels {
			labels[k] = v
		}
		if got := value(find(t, mfs, c.name, labels)); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// one series per path and state; path_up has no state label (a changing label churns series)
	if n := len(mfs["iser_blk_path_state"].Metric); n != 2*len(status.PathStates) {
		t.Errorf("path_state has %d series, want %d", n, 2*len(status.PathStates))
	}
	if n := len(mfs["iser_blk_path_up"].Metric); n != 2 {
		t.Errorf("path_up has %d series, want one per path", n)
	}
	// the second path has answered no NOP yet: no round trip, rather than a false 0
	if n := len(mfs["iser_blk_path_nop_round_trip_seconds"].Metric); n != 1 {
		t.Errorf("nop round trip has %d series, want only the path with samples", n)
	}
	checkHistogram(t, find(t, mfs, "iser_blk_request_duration_seconds", map[string]string{"op": "write"}).Histogram, write.Duration)
	checkHistogram(t, find(t, mfs, "iser_blk_request_duration_seconds", map[string]string{"op": "read"}).Histogram, read.Duration)
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if _, ok := mfs[name]; !ok {
			t.Errorf("runtime/process metric %s missing", name)
		}
	}
}

func checkHistogram(t *testing.T, h *dto.Histogram, want status.Histogram) {
	t.Helper()
	if h.GetSampleCount() != want.Count || h.GetSampleSum() != want.SumSeconds {
		t.Errorf("histogram count/sum %d/%v, want %d/%v", h.GetSampleCount(), h.GetSampleSum(), want.Count, want.SumSeconds)
	}
	got := map[float64]uint64{}
	for _, b := range h.Bucket {
		got[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	for _, b := range want.Buckets {
		if got[b.UpperBound] != b.Count {
			t.Errorf("bucket le=%v: %d, want %d", b.UpperBound, got[b.UpperBound], b.Count)
		}
	}
	if first, last := want.Buckets[0].UpperBound, want.Buckets[len(want.Buckets)-1].UpperBound; first != 10e-6 || last != 10 {
		t.Errorf("buckets span %v..%v, want 10µs..10s", first, last)
	}
}

// TestNamingConventions: every iser_blk_ counter ends in _total, nothing else does, and every
// series carries the name and device labels.
func TestNamingConventions(t *testing.T) {
	reg, _ := newSource(t)
	for name, mf := range scrape(t, reg) {
		if !strings.HasPrefix(name, "iser_blk_") {
			continue
		}
		isCounter := mf.GetType() == dto.MetricType_COUNTER
		if isCounter != strings.HasSuffix(name, "_total") {
			t.Errorf("%s: type %s and name disagree about _total", name, mf.GetType())
		}
		for _, m := range mf.Metric {
			labels := map[string]string{}
			for _, lp := range m.Label {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["name"] != "gw" || labels["device"] != "nbd0" {
				t.Errorf("%s series without the gateway labels: %v", name, labels)
			}
		}
	}
}

func TestCollectorOmitsAbsentLayers(t *testing.T) {
	lm := lifecycle.New()
	reg := status.NewRegistry(status.Identity{Name: "gw", Device: "nbd0"}, lm)
	mfs := scrape(t, reg)
	for _, name := range []string{"iser_blk_cache_dirty_bytes", "iser_blk_path_up", "iser_blk_path_state",
		"iser_blk_path_nop_round_trip_seconds", "iser_blk_lun_size_bytes", "iser_blk_gateway_info",
		"iser_blk_cache_write_back_errors_total", "iser_blk_replacement_timeout_seconds", "iser_blk_no_path_seconds"} {
		if _, ok := mfs[name]; ok {
			t.Errorf("%s exported without its layer", name)
		}
	}
	if v := value(find(t, mfs, "iser_blk_gateway_state", map[string]string{"state": "starting"})); v != 1 {
		t.Errorf("state starting = %v", v)
	}
}

// TestDeviceLabel: the device label is the kernel device's base name or the socket, follows a
// device created after the gateway was named (attach --name), and is the same in status and
// in every series.
func TestDeviceLabel(t *testing.T) {
	for _, tt := range []struct {
		id        status.Identity
		late      string // SetFrontendPath, as attach does once the kernel made the device
		want      string
		wantFirst string // before late
	}{
		{id: status.Identity{Name: "db1", Device: "db1", FrontendKind: "ublk"}, late: "/dev/ublkb3", wantFirst: "db1", want: "ublkb3"},
		{id: status.Identity{Name: "db1", Device: "db1", FrontendKind: "nbd"}, late: "/dev/nbd5", wantFirst: "db1", want: "nbd5"},
		{id: status.Identity{Name: "gw", Device: "gw", FrontendKind: "nbd-socket", FrontendPath: "/run/iser-blk/gw.sock"}, want: "/run/iser-blk/gw.sock"},
		{id: status.Identity{Name: "nbd-tcp-10809", Device: "nbd-tcp-10809", FrontendKind: "nbd-socket", FrontendPath: "127.0.0.1:10809"}, want: "127.0.0.1:10809"},
	} {
		reg := status.NewRegistry(tt.id, lifecycle.New())
		if tt.late != "" {
			if got := deviceLabels(t, reg); got != tt.wantFirst {
				t.Errorf("%+v before its device: device %q, want %q", tt.id, got, tt.wantFirst)
			}
			reg.SetFrontendPath(tt.late)
		}
		if got := deviceLabels(t, reg); got != tt.want {
			t.Errorf("%+v: device %q, want %q", tt.id, got, tt.want)
		}
		if got := reg.Snapshot().Gateway.Device; got != tt.want {
			t.Errorf("%+v: status says device %q, metrics %q", tt.id, got, tt.want)
		}
	}
}

// deviceLabels is the one device label every iser_blk_ series of a scrape carries.
func deviceLabels(t *testing.T, reg *status.Registry) string {
	t.Helper()
	devices := map[string]bool{}
	for name, mf := range scrape(t, reg) {
		if !strings.HasPrefix(name, "iser_blk_") {
			continue
		}
		for _, m := range mf.Metric {
			for _, lp := range m.Label {
				if lp.GetName() == "device" {
					devices[lp.GetValue()] = true
				}
			}
		}
	}
	if len(devices) != 1 {
		t.Fatalf("device labels %v, want one", devices)
	}
	for d := range devices {
		return d
	}
	return ""
}

// TestFenced: gateway_fenced is 1 only while the gateway is failed with status.FencedReason, and
// status says the same.
func TestFenced(t *testing.T) {
	lm := lifecycle.New()
	reg := status.NewRegistry(status.Identity{Name: "gw", Device: "gw", FrontendKind: "ublk", FrontendPath: "/dev/ublkb0"}, lm)
	fenced := func() float64 {
		return value(find(t, scrape(t, reg), "iser_blk_gateway_fenced", map[string]string{"name": "gw", "device": "ublkb0"}))
	}
	for _, step := range []struct {
		state  lifecycle.State
		reason string
		want   float64
	}{
		{lifecycle.Ready, "", 0},
		{lifecycle.Failed, "no path to the target for 2m0s (replacement timeout): I/O fails", 0},
		{lifecycle.Ready, "a path to the target is back", 0},
		{lifecycle.Failed, status.FencedReason + "the previous gateway left dirty write-back data", 1},
	} {
		if err := lm.To(step.state, step.reason); err != nil {
			t.Fatal(err)
		}
		if got := fenced(); got != step.want {
			t.Errorf("%s (%s): gateway_fenced %v, want %v", step.state, step.reason, got, step.want)
		}
		if got := reg.Snapshot().Gateway.Fenced; got != (step.want == 1) {
			t.Errorf("%s (%s): status fenced %v", step.state, step.reason, got)
		}
	}
}
