// Package discovery implements iSCSI SendTargets discovery (RFC 7143 §4.3, Appendix C): a
// discovery session logs in with SessionType=Discovery, sends a Text Request SendTargets=All and
// collects the TargetName/TargetAddress records the target returns (continued over several Text
// Responses when long), then logs out.
package discovery

import (
	"context"
	"fmt"
	"sort"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/session"
)

// Portal is one network portal of a target (a TargetAddress record, §13.8).
type Portal struct {
	Address string // host:port (IPv6 in brackets)
	TPGT    uint16 // target portal group tag
}

// Target is one discovered target and its portals, in the order the target listed them.
type Target struct {
	Name    string
	Portals []Portal
}

// Config is a session.Config for the discovery session; TargetName and Discovery are set by
// SendTargets.
type Config = session.Config

// SendTargets runs a discovery session against cfg.Portal and returns every target it reports.
// A target listed without TargetAddress is reachable at the portal we asked (§4.3, Appendix C:
// the address of the discovery session is implied).
func SendTargets(ctx context.Context, cfg Config) ([]Target, error) {
	cfg.Discovery = true
	cfg.TargetName = ""
	s, err := session.Dial(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	kvs, err := s.Text(ctx, []login.KeyValue{{Key: "SendTargets", Value: "All"}})
	if err != nil {
		return nil, fmt.Errorf("SendTargets at %s: %w", cfg.Portal, err)
	}
	targets, err := Parse(kvs)
	if err != nil {
		return nil, fmt.Errorf("SendTargets at %s: %w", cfg.Portal, err)
	}
	if err := s.Logout(ctx); err != nil {
		return targets, nil // the answer is complete; a failed logout only loses politeness
	}
	return targets, nil
}

// Parse turns SendTargets response keys into targets. Each TargetName starts a record; the
// TargetAddress keys after it belong to it (Appendix C).
func Parse(kvs []login.KeyValue) ([]Target, error) {
	var out []Target
	for _, kv := range kvs {
		switch kv.Key {
		case "TargetName":
			if kv.Value == "" {
				return nil, fmt.Errorf("%w: empty TargetName in SendTargets response", login.ErrProtocol)
			}
			out = append(out, Target{Name: kv.Value})
		case "TargetAddress":
			if len(out) == 0 {
				return nil, fmt.Errorf("%w: TargetAddress before any TargetName", login.ErrProtocol)
			}
			addr, tpgt, err := login.ParseTargetAddress(kv.Value)
			if err != nil {
				return nil, err
			}
			t := &out[len(out)-1]
			t.Portals = append(t.Portals, Portal{Address: addr, TPGT: tpgt})
		default:
			// Other keys (e.g. TargetAlias in some targets) are informational.
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
