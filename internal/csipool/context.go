package csipool

// The volume context: what a volume carries from the controller (CreateVolume) or from a static
// PersistentVolume's volumeAttributes to the node plugin, which attaches the LUN with it. These
// keys are the contract between the two sides (they may be different processes of different
// versions) and with every static PV written by hand, so they never change meaning.

import (
	"fmt"
	"sort"
	"strings"

	"github.com/iser-blk/iser-blk/internal/modes"
)

// Volume context keys (and, for frontend, cache and transport, StorageClass parameters).
const (
	// ContextTarget is the LUN's target URL; other portals of the same LUN follow it,
	// comma-separated (iscsi://host/IQN/LUN,iscsi://host2/IQN/LUN). Never a secret: CHAP
	// secrets reach the node from nodeStageSecretRef.
	ContextTarget = "targets" // internal/csi.KeyTargets: the node plugin reads it
	// ContextTransport is "iscsi" (TCP) or "iser" (RDMA): the URLs' scheme, spelled out so a
	// node can refuse an iSER volume it has no RDMA for before it tries. As a StorageClass
	// parameter it restricts the pool to LUNs of that transport.
	ContextTransport = "transport"
	// ContextFrontend is "ublk" or "nbd": the kernel block device the node attaches. Absent: the
	// node plugin's default.
	ContextFrontend = "frontend"
	// ContextCache is "writeback", "writethrough" or "off" (internal/modes' names; as a
	// StorageClass parameter also the CLI's wb, wt, none). Absent: the node plugin's default.
	ContextCache = "cache"
)

// Transports and frontends the context may name.
const (
	TransportISCSI = "iscsi"
	TransportISER  = "iser"
	FrontendUblk   = string(modes.Ublk)
	FrontendNBD    = string(modes.NBD)
)

// reservedPrefix marks parameters the CO adds for itself (csi-provisioner's
// csi.storage.k8s.io/... secrets and PVC metadata); they are not the driver's to interpret.
const reservedPrefix = "csi.storage.k8s.io/"

// Parameters are a StorageClass's parameters, checked: the options a volume is created with.
type Parameters struct {
	Transport string // "" (any), TransportISCSI or TransportISER
	Frontend  string // "" (node default), FrontendUblk or FrontendNBD
	Cache     string // "" (node default) or a modes.Cache name
}

// ParseParameters checks CreateVolume's (or GetCapacity's) parameters: every key must be one of
// transport, frontend and cache (or the CO's own csi.storage.k8s.io/ keys, ignored), with a
// valid value. An unknown key is an error, not ignored: a misspelt "cahce: off" would otherwise
// give a write-back cache to someone who asked for none.
func ParseParameters(params map[string]string) (Parameters, error) {
	var p Parameters
	for _, k := range sortedKeys(params) {
		v := params[k]
		switch {
		case strings.HasPrefix(k, reservedPrefix):
		case k == ContextTransport:
			if v != TransportISCSI && v != TransportISER {
				return Parameters{}, fmt.Errorf("parameter %s: %q: want %s or %s", k, v, TransportISCSI, TransportISER)
			}
			p.Transport = v
		case k == ContextFrontend:
			if v != FrontendUblk && v != FrontendNBD {
				return Parameters{}, fmt.Errorf("parameter %s: %q: want %s or %s", k, v, FrontendUblk, FrontendNBD)
			}
			p.Frontend = v
		case k == ContextCache:
			if strings.TrimSpace(v) == "" {
				return Parameters{}, fmt.Errorf("parameter %s is empty: want writeback, writethrough or off", k)
			}
			m, err := modes.ParseCache(v)
			if err != nil {
				return Parameters{}, fmt.Errorf("parameter %s: %v", k, err)
			}
			p.Cache = m.String()
		default:
			return Parameters{}, fmt.Errorf("unknown parameter %q (want %s, %s or %s)", k, ContextTransport, ContextFrontend, ContextCache)
		}
	}
	return p, nil
}

// volumeContext is the context of a volume on lun created with p.
func volumeContext(lun LUN, p Parameters) map[string]string {
	c := map[string]string{ContextTarget: lun.Target(), ContextTransport: lun.Transport}
	if p.Frontend != "" {
		c[ContextFrontend] = p.Frontend
	}
	if p.Cache != "" {
		c[ContextCache] = p.Cache
	}
	return c
}

// VolumeContext is a volume context, checked.
type VolumeContext struct {
	URLs      []string // the first is the LUN's URL, the rest other portals of it
	Transport string
	Frontend  string // "" when absent
	Cache     string // "" when absent
}

// ParseVolumeContext checks a volume context (a dynamic volume's, or a static PV's
// volumeAttributes) the way the node plugin needs it: a target of one LUN on one or more
// portals, a transport matching its scheme, and valid frontend and cache values. An unknown key
// is an error (a misspelt key in a hand-written PV would otherwise be ignored).
func ParseVolumeContext(c map[string]string) (VolumeContext, error) {
	var vc VolumeContext
	for _, k := range sortedKeys(c) {
		switch k {
		case ContextTarget, ContextTransport, ContextFrontend, ContextCache:
		default:
			if !strings.HasPrefix(k, reservedPrefix) {
				return VolumeContext{}, fmt.Errorf("unknown volume attribute %q (want %s, %s, %s or %s)", k,
					ContextTarget, ContextTransport, ContextFrontend, ContextCache)
			}
		}
	}
	target, ok := c[ContextTarget]
	if !ok || target == "" {
		return VolumeContext{}, fmt.Errorf("volume attribute %s is missing", ContextTarget)
	}
	lun, err := parseLine(target)
	if err != nil {
		return VolumeContext{}, fmt.Errorf("volume attribute %s: %w", ContextTarget, err)
	}
	vc.URLs, vc.Transport = lun.URLs, lun.Transport
	if t, ok := c[ContextTransport]; ok && t != lun.Transport {
		return VolumeContext{}, fmt.Errorf("volume attribute %s is %q but the target's scheme is %s", ContextTransport, t, lun.Transport)
	}
	p, err := presentParameters(c)
	if err != nil {
		return VolumeContext{}, err
	}
	vc.Frontend, vc.Cache = p.Frontend, p.Cache
	return vc, nil
}

// presentParameters parses the frontend and cache keys c has.
func presentParameters(c map[string]string) (Parameters, error) {
	only := map[string]string{}
	for _, k := range []string{ContextFrontend, ContextCache} {
		if v, ok := c[k]; ok {
			only[k] = v
		}
	}
	p, err := ParseParameters(only)
	if err != nil {
		return Parameters{}, fmt.Errorf("volume attribute: %w", err)
	}
	return p, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
