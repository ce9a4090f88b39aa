package status

import (
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"sort"
	"testing"

	"github.com/iser-blk/iser-blk/internal/lifecycle"
)

type fakeLayers struct{ IOCounters }

func (*fakeLayers) PathsStatus() []Path {
	return []Path{{Portal: "127.0.0.1:3260", Transport: "tcp", State: "up", Reconnects: 2}}
}
func (*fakeLayers) LUNStatus() LUN           { return LUN{SizeBytes: 1 << 30, BlockSize: 512} }
func (*fakeLayers) FrontendStatus() Frontend { return Frontend{Kind: "nbd-socket", Connections: 1} }
func (*fakeLayers) CacheStatus() Cache {
	c := Cache{Mode: "writeback", Hits: 3, Misses: 1}
	c.SetHitRatio()
	return c
}

func TestRegistryOmitsUnregisteredParts(t *testing.T) {
	lm := lifecycle.New()
	r := NewRegistry(Identity{Name: "gw", Targets: []string{"iscsi://h/iqn/0"}}, lm)
	st := r.Snapshot()
	if st.Version != Version || st.Gateway.Name != "gw" || st.Gateway.PID != os.Getpid() {
		t.Fatalf("gateway %+v", st.Gateway)
	}
	if st.Gateway.State != "starting" {
		t.Fatalf("state %q", st.Gateway.State)
	}
	if st.LUN != nil || st.Cache != nil || st.Frontend != nil || len(st.Paths) != 0 || st.Paths == nil {
		t.Fatalf("unregistered parts present: %+v", st)
	}
}

func TestRegistryReadsEveryProvider(t *testing.T) {
	lm := lifecycle.New()
	r := NewRegistry(Identity{Name: "gw"}, lm)
	var l fakeLayers
	l.IOCounters.Op(OpRead).Observe(4096, 1, false)
	r.SetPaths(&l)
	r.SetLUN(&l)
	r.SetFrontend(&l)
	r.SetCache(&l)
	r.SetIO(&l)
	if err := lm.To(lifecycle.Ready, ""); err != nil {
		t.Fatal(err)
	}
	st := r.Snapshot()
	if st.Gateway.State != "ready" || st.Paths[0].Reconnects != 2 || st.LUN.SizeBytes != 1<<30 ||
		st.Frontend.Connections != 1 || st.Cache.HitRatio != 0.75 || st.IO.Ops[OpRead].Bytes != 4096 {
		t.Fatalf("snapshot %+v", st)
	}
}

// TestJSONNamesAreSnakeCase guards the schema's naming rule: every JSON key of version 1 is
// lower snake_case (or Prometheus' "le").
func TestJSONNamesAreSnakeCase(t *testing.T) {
	lm := lifecycle.New()
	r := NewRegistry(Identity{Name: "gw"}, lm)
	var l fakeLayers
	r.SetPaths(&l)
	r.SetLUN(&l)
	r.SetFrontend(&l)
	r.SetCache(&l)
	r.SetIO(&l)
	raw, err := json.Marshal(r.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	collectKeys(v, keys)
	snake := regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
	var bad []string
	for k := range keys {
		if !snake.MatchString(k) {
			bad = append(bad, k)
		}
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Fatalf("keys not snake_case: %v", bad)
	}
	for _, k := range []string{"version", "gateway", "paths", "io", "max_recv_data_segment_length_target", "duration_seconds", "le"} {
		if !keys[k] {
			t.Errorf("key %q missing", k)
		}
	}
	var back Status
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Paths, l.PathsStatus()) {
		t.Fatalf("paths do not round-trip: %+v", back.Paths)
	}
}

func collectKeys(v any, keys map[string]bool) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			keys[k] = true
			collectKeys(e, keys)
		}
	case []any:
		for _, e := range x {
			collectKeys(e, keys)
		}
	}
}
