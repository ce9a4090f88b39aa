package status

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/modes"
)

// The Providers: each layer implements the one for its part with a small method that reads its
// atomics. They are called off the data path (a status request, a scrape), may be called
// concurrently, and must not block on I/O.
type (
	PathsProvider    interface{ PathsStatus() []Path }
	LUNProvider      interface{ LUNStatus() LUN }
	FrontendProvider interface{ FrontendStatus() Frontend }
	CacheProvider    interface{ CacheStatus() Cache }
	IOProvider       interface{ IOStatus() IO }
	// ReplacementProvider is optional: a PathsProvider that implements it (backend/iser) fills
	// Status.Replacement too.
	ReplacementProvider interface{ ReplacementStatus() Replacement }
	// RDMAProvider is optional too: a PathsProvider that implements it (backend/iser) fills
	// Status.RDMA with what RDMAStatus returns (nil: the backend has no iSER path).
	RDMAProvider interface{ RDMAStatus() *RDMA }
)

// FencedReason begins the lifecycle reason of a gateway whose device is fenced (it took over
// a device whose predecessor left dirty write-back data: docs/reliability.md); Gateway.Fenced
// and the metrics' gateway_fenced are read from it.
const FencedReason = "device fenced: "

// Identity is what the gateway knows about itself when it starts.
type Identity struct {
	Name string
	// Device is the device label until the frontend path is known; from then on the label is
	// derived from FrontendKind and FrontendPath (DeviceLabel).
	Device       string
	FrontendKind modes.Frontend
	FrontendPath string
	Targets      []string // already redacted by the caller (iser.RedactURL): Registry does not parse URLs
	CacheMode    modes.Cache
	BuildVersion string
}

// Registry assembles a Status from the registered providers. Layers register once they exist
// (the backend after login, the frontend once serving); a part not registered is omitted from
// the Status (nil, or empty for lists). Safe for concurrent use.
type Registry struct {
	mu        sync.RWMutex
	id        Identity
	lifecycle *lifecycle.Machine
	paths     PathsProvider
	lun       LUNProvider
	frontend  FrontendProvider
	cache     CacheProvider
	io        IOProvider
}

// NewRegistry returns a Registry for the gateway id whose state lm holds.
func NewRegistry(id Identity, lm *lifecycle.Machine) *Registry {
	return &Registry{id: id, lifecycle: lm}
}

// SetPaths registers the backend's paths; the others likewise. A nil provider unregisters.
func (r *Registry) SetPaths(p PathsProvider)       { r.mu.Lock(); r.paths = p; r.mu.Unlock() }
func (r *Registry) SetLUN(p LUNProvider)           { r.mu.Lock(); r.lun = p; r.mu.Unlock() }
func (r *Registry) SetFrontend(p FrontendProvider) { r.mu.Lock(); r.frontend = p; r.mu.Unlock() }
func (r *Registry) SetCache(p CacheProvider)       { r.mu.Lock(); r.cache = p; r.mu.Unlock() }
func (r *Registry) SetIO(p IOProvider)             { r.mu.Lock(); r.io = p; r.mu.Unlock() }

// Identity returns the gateway's identity.
func (r *Registry) Identity() Identity {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.id
}

// SetFrontendPath records the device path once the kernel has created it (a gateway named by
// --name before its /dev/ublkbN or /dev/nbdX existed).
func (r *Registry) SetFrontendPath(path string) { r.mu.Lock(); r.id.FrontendPath = path; r.mu.Unlock() }

// Snapshot reads every registered provider once.
func (r *Registry) Snapshot() Status {
	r.mu.RLock()
	defer r.mu.RUnlock()
	st := Status{Version: Version, Gateway: r.gateway(), Paths: []Path{}}
	if r.paths != nil {
		st.Paths = r.paths.PathsStatus()
		if rp, ok := r.paths.(ReplacementProvider); ok {
			rs := rp.ReplacementStatus()
			st.Replacement = &rs
		}
		if rp, ok := r.paths.(RDMAProvider); ok {
			st.RDMA = rp.RDMAStatus()
		}
	}
	if r.lun != nil {
		l := r.lun.LUNStatus()
		st.LUN = &l
	}
	if r.frontend != nil {
		f := r.frontend.FrontendStatus()
		st.Frontend = &f
	}
	if r.cache != nil {
		c := r.cache.CacheStatus()
		st.Cache = &c
	}
	if r.io != nil {
		st.IO = r.io.IOStatus()
	}
	if st.IO.Ops == nil {
		st.IO.Ops = []OpStats{}
	}
	return st
}

func (r *Registry) gateway() Gateway {
	state, reason := r.lifecycle.State()
	started := r.lifecycle.Started()
	targets := append([]string{}, r.id.Targets...)
	return Gateway{
		Name:          r.id.Name,
		PID:           os.Getpid(),
		Device:        DeviceLabel(r.id),
		FrontendKind:  r.id.FrontendKind,
		FrontendPath:  r.id.FrontendPath,
		Targets:       targets,
		CacheMode:     r.id.CacheMode,
		State:         string(state),
		StateReason:   reason,
		Fenced:        state == lifecycle.Failed && strings.HasPrefix(reason, FencedReason),
		StartedAt:     started.UTC(),
		UptimeSeconds: time.Since(started).Seconds(),
		BuildVersion:  r.id.BuildVersion,
	}
}

// DeviceLabel is the gateway's device as the metrics' device label and status' gateway.device
// name it, so that it joins with node_exporter's node_disk_*{device} and the kernel's names: the
// block device's base name for the kernel frontends (nbd0, ublkb3), the socket for an NBD server
// (its path, or host:port for TCP); id.Device until the frontend path is known (a gateway named by
// --name before the kernel created its device).
func DeviceLabel(id Identity) string {
	if id.FrontendPath == "" {
		return id.Device
	}
	switch id.FrontendKind {
	case modes.NBD, modes.Ublk:
		return filepath.Base(id.FrontendPath)
	case modes.NBDSocket:
		return id.FrontendPath
	}
	return id.Device
}
