package status

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	up := Path{Portal: "192.0.2.1:3260", State: "up"}
	down := Path{Portal: "192.0.2.2:3260", State: "down"}
	for _, c := range []struct {
		name    string
		st      Status
		healthy bool
		why     string
	}{
		{"ready, paths up", Status{Gateway: Gateway{State: "ready"}, Paths: []Path{up, {State: "standby"}}}, true, ""},
		{"serve of a mem target (no paths)", Status{Gateway: Gateway{State: "ready"}}, true, ""},
		{"degraded", Status{Gateway: Gateway{State: "ready"}, Paths: []Path{up, down}}, false, "degraded: 1 of 2 paths"},
		{"failed", Status{Gateway: Gateway{State: "failed", StateReason: "no path to the target"}}, false, "failed: no path"},
		{"fenced", Status{Gateway: Gateway{State: "failed", Fenced: true, StateReason: FencedReason + "gateway (pid 7) died"}}, false, "fenced: gateway (pid 7)"},
		{"restarting", Status{Gateway: Gateway{State: "restarting"}}, false, "not serving: restarting"},
	} {
		h := Check(c.st)
		if h.Healthy != c.healthy || !strings.HasPrefix(h.Why, c.why) {
			t.Errorf("%s: %+v, want healthy %v, why %q…", c.name, h, c.healthy, c.why)
		}
	}
}
