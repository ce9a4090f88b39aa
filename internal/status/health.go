package status

import (
	"fmt"
	"strings"
)

// Health is a gateway's verdict for monitoring (`iser-blk status --check`): Healthy only while it
// serves with every path up (or standby); Why says what is wrong otherwise.
type Health struct {
	Healthy bool
	Why     string
}

// Check reads st's verdict. Unhealthy: a fenced device (every I/O fails), a failed gateway, one
// not serving (starting, recovering, restarting, stopping), and a degraded one — serving, but a
// path is down or recovering, so one more failure away from failing I/O.
func Check(st Status) Health {
	g := st.Gateway
	switch {
	case g.Fenced:
		return Health{Why: "fenced: " + strings.TrimPrefix(g.StateReason, FencedReason)}
	case g.State == "failed":
		return Health{Why: "failed: " + g.StateReason}
	case g.State != "ready":
		return Health{Why: "not serving: " + g.State}
	}
	var down []string
	for _, p := range st.Paths {
		if p.State == "down" || p.State == "recovering" {
			down = append(down, p.Portal+" "+p.State)
		}
	}
	if len(down) > 0 {
		return Health{Why: fmt.Sprintf("degraded: %d of %d paths not up (%s)", len(down), len(st.Paths), strings.Join(down, ", "))}
	}
	return Health{Healthy: true}
}
