package csi

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/dustin/go-humanize"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/internal/modes"
)

// Volume context keys (a PersistentVolume's spec.csi.volumeAttributes, or what the controller
// puts in CreateVolume's answer). docs/csi.md documents them.
const (
	// KeyTargets is one or more target URLs, comma-separated: iscsi://host[:port]/IQN[/LUN] or
	// iser://...; several are the portals of one LUN (multipath), so they must agree on the IQN
	// and the LUN.
	KeyTargets = "targets"
	// KeyLUN is the LUN, when the URLs do not end in one.
	KeyLUN = "lun"
	// KeyTransport is "iscsi" (TCP) or "iser" (RDMA); when given, every URL's scheme must be it.
	KeyTransport = "transport"
	// KeyFrontend is "ublk" or "nbd"; empty or absent: ublk where the kernel has it, else nbd.
	KeyFrontend = "frontend"
	// KeyCache is the gateway's --cache mode: writeback (default), writethrough or off.
	KeyCache = "cache"
	// KeyCacheDevSize asks for a persistent write-back log (--cache-dev) of this size ("4GiB")
	// in a file on the node, in the plugin's --cache-dev-dir (docs/cache-dev.md): fsync at
	// local-disk speed. Only with the write-back cache.
	KeyCacheDevSize = "cache-dev-size"
)

// minCacheDevSize is the smallest cache device a volume may ask for (the journal's MinSize plus
// its two superblocks: cache/journal refuses less).
const minCacheDevSize = 16<<20 + 8192

// knownKeys are the keys ParseVolumeContext accepts.
var knownKeys = []string{KeyTargets, KeyLUN, KeyTransport, KeyFrontend, KeyCache, KeyCacheDevSize}

// coPrefixes are the key prefixes a CO adds on its own (Kubernetes: the pod information of
// podInfoOnMount, the provisioner's identity); they are not the user's, so strictness does not
// apply to them.
var coPrefixes = []string{"csi.storage.k8s.io/", "storage.kubernetes.io/"}

// Secret keys (the node-stage secret: a Kubernetes Secret named by nodeStageSecretRef).
const (
	SecretCHAPUser     = "chap-user"     // CHAP user name
	SecretCHAPSecret   = "chap-secret"   // its secret
	SecretTargetUser   = "target-user"   // mutual CHAP: the name the target must present (optional)
	SecretTargetSecret = "target-secret" // mutual CHAP: the target's secret
)

var knownSecrets = []string{SecretCHAPUser, SecretCHAPSecret, SecretTargetUser, SecretTargetSecret}

// FrontendAuto is the frontend of a volume context without one: ublk where the kernel has it,
// else nbd (Gateways decides, on the node).
const FrontendAuto modes.Frontend = ""

// Volume is what a volume context asks for.
type Volume struct {
	Targets  []string       // full target URLs, LUN included, without user@; one per portal
	Frontend modes.Frontend // modes.Ublk, modes.NBD or FrontendAuto
	Cache    modes.Cache
	// CacheDevSize is the size of the volume's cache device on the node; 0: none.
	CacheDevSize int64
}

// CHAP is a node-stage secret's credentials; the zero value is no CHAP.
type CHAP struct {
	User, Secret             string
	TargetUser, TargetSecret string
}

// ParseVolumeContext checks a volume context strictly: an unknown key, a malformed URL, URLs
// that name different LUNs, a transport the URLs contradict, or a CHAP user in a URL (it goes in
// the node-stage secret) is an error saying what to fix. Errors name keys, never secret values.
func ParseVolumeContext(vc map[string]string) (Volume, error) {
	for k := range vc {
		if !slices.Contains(knownKeys, k) && !hasCOPrefix(k) {
			return Volume{}, fmt.Errorf("unknown volume context key %q (known: %s)", k, strings.Join(knownKeys, ", "))
		}
	}
	var v Volume
	raw := strings.TrimSpace(vc[KeyTargets])
	if raw == "" {
		return Volume{}, fmt.Errorf("volume context key %q is required: iscsi://HOST[:PORT]/IQN/LUN, comma-separated for several portals", KeyTargets)
	}
	lun, hasLUN := vc[KeyLUN]
	if hasLUN {
		n, err := strconv.ParseUint(strings.TrimSpace(lun), 10, 16)
		if err != nil || n > 16383 {
			return Volume{}, fmt.Errorf("volume context %q: %q is not a LUN (0..16383)", KeyLUN, lun)
		}
		lun = strconv.FormatUint(n, 10)
	}
	transport, hasTransport := vc[KeyTransport]
	if hasTransport && transport != "iscsi" && transport != "iser" {
		return Volume{}, fmt.Errorf("volume context %q: %q, want iscsi or iser", KeyTransport, transport)
	}
	var first iser.Target
	for i, u := range strings.Split(raw, ",") {
		u = strings.TrimRight(strings.TrimSpace(u), "/")
		if u == "" {
			return Volume{}, fmt.Errorf("volume context %q: empty URL in the list", KeyTargets)
		}
		if hasLUN {
			u += "/" + lun
		}
		t, err := iser.ParseURL(u)
		if err != nil {
			if hasLUN {
				return Volume{}, fmt.Errorf("volume context %q (the LUN is in %q, so the URLs end at the IQN): %v", KeyTargets, KeyLUN, err)
			}
			return Volume{}, fmt.Errorf("volume context %q: %v", KeyTargets, err)
		}
		if t.User != "" {
			return Volume{}, fmt.Errorf("volume context %q: a CHAP user goes in the node-stage secret (%q), not in the URL", KeyTargets, SecretCHAPUser)
		}
		if hasTransport && t.Transport != transport {
			return Volume{}, fmt.Errorf("volume context %q is %s, but a URL is %s://", KeyTransport, transport, t.Transport)
		}
		if i == 0 {
			first = t
		} else if t.IQN != first.IQN || t.LUN != first.LUN || t.Transport != first.Transport {
			return Volume{}, fmt.Errorf("volume context %q: the portals of one volume must name the same transport, IQN and LUN (%s, %s)", KeyTargets, first, t)
		}
		s := t.String()
		if slices.Contains(v.Targets, s) {
			return Volume{}, fmt.Errorf("volume context %q: %s is listed twice", KeyTargets, s)
		}
		v.Targets = append(v.Targets, s)
	}
	switch f := modes.Frontend(vc[KeyFrontend]); f {
	case FrontendAuto, modes.Ublk, modes.NBD:
		v.Frontend = f
	default:
		return Volume{}, fmt.Errorf("volume context %q: %q, want ublk or nbd (or leave it out: ublk where the kernel has it)", KeyFrontend, f)
	}
	if c, ok := vc[KeyCache]; ok {
		m, err := modes.ParseCache(c)
		if err != nil || c == "" {
			return Volume{}, fmt.Errorf("volume context %q: %q, want writeback, writethrough or off", KeyCache, c)
		}
		v.Cache = m
	}
	if raw, ok := vc[KeyCacheDevSize]; ok {
		n, err := humanize.ParseBytes(strings.TrimSpace(raw))
		if err != nil || n < minCacheDevSize || n > 1<<50 {
			return Volume{}, fmt.Errorf("volume context %q: %q, want a size of at least 16MiB, like 4GiB", KeyCacheDevSize, raw)
		}
		if v.Cache != modes.WriteBack {
			return Volume{}, fmt.Errorf("volume context %q needs the write-back cache, but %q is %s", KeyCacheDevSize, KeyCache, v.Cache)
		}
		v.CacheDevSize = int64(n)
	}
	return v, nil
}

func hasCOPrefix(k string) bool {
	for _, p := range coPrefixes {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}

// ParseSecrets reads the node-stage secret. Unknown keys are refused (a typo would otherwise log
// in without CHAP and fail far from its cause); a secret without its user, or the reverse, is
// refused. Errors name keys only.
func ParseSecrets(s map[string]string) (CHAP, error) {
	for k := range s {
		if !slices.Contains(knownSecrets, k) {
			return CHAP{}, fmt.Errorf("unknown node-stage secret key %q (known: %s)", k, strings.Join(knownSecrets, ", "))
		}
	}
	c := CHAP{User: s[SecretCHAPUser], Secret: s[SecretCHAPSecret], TargetUser: s[SecretTargetUser], TargetSecret: s[SecretTargetSecret]}
	switch {
	case c.User == "" && (c.Secret != "" || c.TargetSecret != "" || c.TargetUser != ""):
		return CHAP{}, fmt.Errorf("node-stage secret: %q is required with the other CHAP keys", SecretCHAPUser)
	case c.User != "" && c.Secret == "":
		return CHAP{}, fmt.Errorf("node-stage secret: %q needs %q", SecretCHAPUser, SecretCHAPSecret)
	case c.TargetUser != "" && c.TargetSecret == "":
		return CHAP{}, fmt.Errorf("node-stage secret: %q needs %q", SecretTargetUser, SecretTargetSecret)
	case strings.ContainsAny(c.User+c.TargetUser, "\n\r"), strings.ContainsAny(c.Secret+c.TargetSecret, "\n\r"):
		// a secret file is one line; a newline would be cut off silently
		return CHAP{}, fmt.Errorf("node-stage secret: a CHAP user or secret holds a line break")
	}
	return c, nil
}
