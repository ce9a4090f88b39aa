package csipool

// The CSI controller service over the pool: CreateVolume claims the smallest free LUN that fits,
// DeleteVolume returns it to be erased (erasing.go) before it is free again, and the claims file
// records each change before the answer (doc.go states the invariants and the lock order).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// DefaultClaimsFile is where the controller keeps its claims unless told otherwise. It must be
// on storage that outlives the controller (docs/kubernetes.md).
const DefaultClaimsFile = "/var/lib/iser-blk-csi/claims.json"

// DefaultProbeRetry is how long a LUN whose size could not be read is left alone.
const DefaultProbeRetry = time.Minute

// Config configures New.
type Config struct {
	// Pool is the pool's LUNs (ReadPool).
	Pool []LUN
	// ClaimsFile is the claims file's path (DefaultClaimsFile when ""); its directory is
	// created if missing. FILE.lock beside it is held for the controller's life.
	ClaimsFile string
	// Prober reads LUN sizes (ISERProber in production).
	Prober Prober
	// Eraser zeroes the LUN of a deleted volume before it is handed out again (ISEREraser in
	// production). Required unless NoErase.
	Eraser Eraser
	// NoErase frees a deleted volume's LUN at once, unerased: for arrays that erase returned
	// LUNs themselves (`iser-blk csi --pool-erase none`). LUNs the claims file holds mid-erase
	// are then freed at start, with a warning.
	NoErase bool
	// EraseRetry is the back-off after a failed erase (DefaultEraseRetry when 0); it doubles
	// after each failure, up to MaxEraseRetry.
	EraseRetry time.Duration
	// ProbeRetry is the back-off after a failed probe (DefaultProbeRetry when 0).
	ProbeRetry time.Duration
	// Logger receives the controller's logs (nil: none).
	Logger *zap.Logger
	// Now is the clock (nil: time.Now); tests step it past the back-off.
	Now func() time.Time
}

// Controller is the CSI controller service of a pool. Its methods are safe for concurrent use.
type Controller struct {
	csi.UnimplementedControllerServer

	pool   []LUN
	byKey  map[string]LUN
	path   string
	lock   *os.File // FILE.lock, flocked
	sizes  *sizeCache
	log    *zap.Logger
	now    func() time.Time
	closed sync.Once

	// The background erases (erasing.go): eraser is nil with NoErase; bg ends at Close, which
	// waits for bgWG.
	eraser     Eraser
	eraseRetry time.Duration
	eraseSlots chan struct{}
	bg         context.Context
	bgCancel   context.CancelFunc
	bgWG       sync.WaitGroup

	// mu guards the claims and the erasing LUNs, in memory and in the file: a change is written
	// to the file with mu held, so the file's order of changes is memory's.
	mu      sync.Mutex
	byID    map[string]*Claim
	byName  map[string]*Claim
	byLUN   map[string]*Claim
	erasing map[string]*Erasing // by LUN key
	// eraseFailed holds the LUNs being erased whose last attempt failed (target down): waiting
	// for them is pointless.
	eraseFailed map[string]bool
	// erased is closed (and replaced) whenever an erase frees a LUN: CreateVolume waits on it
	// when only LUNs being erased would fit.
	erased chan struct{}
}

var _ csi.ControllerServer = (*Controller)(nil)

// New opens the claims file (taking its lock; a missing file is a first start, and is written
// empty) and returns the controller. It probes nothing: sizes are read when first needed
// (CreateVolume, GetCapacity), or by Probe.
func New(cfg Config) (*Controller, error) {
	if len(cfg.Pool) == 0 {
		return nil, fmt.Errorf("%w: no LUNs", ErrPool)
	}
	if cfg.Prober == nil {
		return nil, errors.New("csipool: no Prober")
	}
	if cfg.Eraser == nil && !cfg.NoErase {
		return nil, errors.New("csipool: no Eraser (NoErase only for arrays that erase returned LUNs themselves)")
	}
	c := &Controller{
		pool: cfg.Pool, byKey: map[string]LUN{}, path: cfg.ClaimsFile, log: cfg.Logger, now: cfg.Now,
		byID: map[string]*Claim{}, byName: map[string]*Claim{}, byLUN: map[string]*Claim{}, erasing: map[string]*Erasing{}, eraseFailed: map[string]bool{}, erased: make(chan struct{}),
		eraser: cfg.Eraser, eraseRetry: cfg.EraseRetry, eraseSlots: make(chan struct{}, eraseParallel),
	}
	if cfg.NoErase {
		c.eraser = nil
	}
	if c.eraseRetry <= 0 {
		c.eraseRetry = DefaultEraseRetry
	}
	if c.path == "" {
		c.path = DefaultClaimsFile
	}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	if c.now == nil {
		c.now = time.Now
	}
	retry := cfg.ProbeRetry
	if retry <= 0 {
		retry = DefaultProbeRetry
	}
	c.sizes = newSizeCache(cfg.Prober, retry, c.now, c.log)
	for _, l := range c.pool {
		if _, dup := c.byKey[l.Key]; dup {
			return nil, fmt.Errorf("%w: LUN %s twice", ErrPool, l.Key)
		}
		c.byKey[l.Key] = l
	}
	if err := os.MkdirAll(filepath.Dir(c.path), 0o700); err != nil {
		return nil, fmt.Errorf("claims file: %w", err)
	}
	lock, err := lockFile(c.path + ".lock")
	if err != nil {
		return nil, err
	}
	c.lock = lock
	st, err := loadClaims(c.path)
	if err != nil {
		lock.Close()
		return nil, err
	}
	if c.eraser == nil && len(st.Erasing) > 0 {
		for _, e := range st.Erasing {
			c.log.Warn("erasing is off: a LUN left mid-erase by an earlier start is free again, unerased",
				zap.String("lun", e.LUN), zap.String("volume_id", e.VolumeID), zap.Time("deleted", e.Deleted))
		}
		st.Erasing = []Erasing{}
	}
	// Written back at once: a claims directory that cannot be written (read-only mount, full
	// disk) fails the start, not the first CreateVolume hours later, the file exists from the
	// first start for backups to find, and a file of an older version is of this one from now.
	if err := WriteClaims(c.path, st); err != nil {
		lock.Close()
		return nil, err
	}
	claims := st.Claims
	for i := range claims {
		cl := &claims[i]
		c.byID[cl.ID], c.byName[cl.Name], c.byLUN[cl.LUN] = cl, cl, cl
		if _, inPool := c.byKey[cl.LUN]; !inPool {
			// Kept: the volume still exists and holds data; it is only no longer handed out
			// again once deleted.
			c.log.Warn("a claimed LUN is no longer in the pool file; the volume is kept",
				zap.String("volume_id", cl.ID), zap.String("lun", cl.LUN))
		}
	}
	c.bg, c.bgCancel = context.WithCancel(context.Background())
	c.mu.Lock()
	for i := range st.Erasing {
		e := &st.Erasing[i]
		c.erasing[e.LUN] = e
		c.startEraseLocked(e)
	}
	c.mu.Unlock()
	c.log.Info("pool controller ready", zap.Int("luns", len(c.pool)), zap.Int("claimed", len(claims)),
		zap.Int("erasing", len(st.Erasing)), zap.Bool("erase", c.eraser != nil), zap.String("claims_file", c.path))
	return c, nil
}

// lockFile takes an exclusive flock on path (created 0600), without waiting: a second controller
// on the same claims file is a configuration error to report, not to queue behind.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("claims file lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("claims file lock %s is held by another controller", path)
		}
		return nil, fmt.Errorf("claims file lock %s: %w", path, err)
	}
	return f, nil
}

// Close stops the erases in progress (their LUNs stay erasing in the claims file, and the next
// start erases them again), waits for them, and releases the claims file's lock. The controller
// must not be used after.
func (c *Controller) Close() error {
	var err error
	c.closed.Do(func() {
		c.mu.Lock() // no erase starts after this (startEraseLocked)
		c.bgCancel()
		c.mu.Unlock()
		c.bgWG.Wait()
		err = c.lock.Close()
	})
	return err
}

// Probe reads the size of every free LUN not known yet (the command may call it at start, so
// the first CreateVolume does not wait for the logins).
func (c *Controller) Probe(ctx context.Context) error {
	return c.sizes.probe(ctx, c.freeLUNs())
}

// freeLUNs is the pool's LUNs no claim holds and none is erasing, in pool order.
func (c *Controller) freeLUNs() []LUN {
	c.mu.Lock()
	defer c.mu.Unlock()
	var free []LUN
	for _, l := range c.pool {
		if !c.heldLocked(l.Key) {
			free = append(free, l)
		}
	}
	return free
}

// heldLocked reports whether the LUN is not free: a volume holds it, or it is being erased.
// c.mu is held.
func (c *Controller) heldLocked(key string) bool {
	return c.byLUN[key] != nil || c.erasing[key] != nil
}

// persistLocked writes the claims and erasing LUNs in memory to the file. c.mu is held.
func (c *Controller) persistLocked() error {
	st := ClaimsState{Claims: make([]Claim, 0, len(c.byID)), Erasing: make([]Erasing, 0, len(c.erasing))}
	for _, cl := range c.byID {
		st.Claims = append(st.Claims, *cl)
	}
	for _, e := range c.erasing {
		st.Erasing = append(st.Erasing, *e)
	}
	return WriteClaims(c.path, st)
}

// DeleteVolume deletes the volume: its LUN is recorded as erasing and erased in the background
// (erasing.go), and free for CreateVolume only once erased; with NoErase it is free at once. The
// call does not wait for the erase (a LUN of many GiB takes minutes to zero, longer than
// csi-provisioner's call timeout). An unknown ID succeeds (it was deleted before, possibly still
// being erased, or never made here).
func (c *Controller) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "no volume ID")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := c.byID[id]
	if cl == nil {
		return &csi.DeleteVolumeResponse{}, nil
	}
	delete(c.byID, id)
	delete(c.byName, cl.Name)
	delete(c.byLUN, cl.LUN)
	var e *Erasing
	if c.eraser != nil {
		e = &Erasing{LUN: cl.LUN, Size: cl.Size, VolumeID: cl.ID, Deleted: c.now().UTC()}
		c.erasing[cl.LUN] = e
	}
	if err := c.persistLocked(); err != nil {
		c.byID[id], c.byName[cl.Name], c.byLUN[cl.LUN] = cl, cl, cl
		delete(c.erasing, cl.LUN)
		c.log.Error("claims file not written; the volume was not deleted", zap.String("volume_id", id), zap.Error(err))
		return nil, status.Errorf(codes.Internal, "recording the release: %v", err)
	}
	if e == nil {
		c.sizes.set(cl.LUN, cl.Size)
		c.log.Info("volume deleted; its LUN is free, unerased (erasing is off)", zap.String("volume_id", id), zap.String("name", cl.Name), zap.String("lun", cl.LUN))
		return &csi.DeleteVolumeResponse{}, nil
	}
	c.log.Info("volume deleted; its LUN is erased before it is free", zap.String("volume_id", id), zap.String("name", cl.Name), zap.String("lun", cl.LUN))
	c.startEraseLocked(e)
	return &csi.DeleteVolumeResponse{}, nil
}

// ValidateVolumeCapabilities confirms the capabilities (and parameters) when a pool volume has
// them all; else it answers without a confirmation and says why. NotFound for an unknown ID.
func (c *Controller) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "no volume ID")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "no volume capabilities")
	}
	c.mu.Lock()
	cl := c.byID[id]
	c.mu.Unlock()
	if cl == nil {
		return nil, status.Errorf(codes.NotFound, "no volume %s", id)
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	if _, err := ParseParameters(req.GetParameters()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// ListVolumes lists the volumes in volume ID order. The token is the last ID of the previous
// page and the next page starts after it, so volumes deleted or created between pages never
// make a page repeat or skip one that existed throughout. A token that is not an ID of this
// controller's form is Aborted (the CSI spec's code for an invalid starting_token).
func (c *Controller) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	maxEntries := int(req.GetMaxEntries())
	if maxEntries < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "max_entries %d is negative", maxEntries)
	}
	after := req.GetStartingToken()
	if after != "" && !validID(after) {
		return nil, status.Errorf(codes.Aborted, "starting_token %.80q is not one ListVolumes gave", after)
	}
	c.mu.Lock()
	ids := make([]string, 0, len(c.byID))
	for id := range c.byID {
		if id > after {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	next := ""
	if maxEntries > 0 && len(ids) > maxEntries {
		ids = ids[:maxEntries]
		next = ids[maxEntries-1]
	}
	resp := &csi.ListVolumesResponse{NextToken: next}
	for _, id := range ids {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: volumeOf(c.byID[id])})
	}
	c.mu.Unlock()
	return resp, nil
}

// GetCapacity reports the pool's free capacity: available_capacity is the sum of the free LUNs'
// sizes (what the pool still holds), maximum_volume_size the largest free LUN (the largest
// required_bytes a CreateVolume can get now; a request cannot span LUNs). LUNs whose size cannot
// be read count for nothing, and so do LUNs being erased (not available until erased).
// Capabilities a pool volume cannot have get 0; parameters restrict
// the count to the transport they name, and invalid ones are InvalidArgument.
func (c *Controller) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	params, err := ParseParameters(req.GetParameters())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if len(req.GetVolumeCapabilities()) > 0 && checkCapabilities(req.GetVolumeCapabilities()) != nil {
		return &csi.GetCapacityResponse{AvailableCapacity: 0}, nil
	}
	if err := c.sizes.probe(ctx, c.freeLUNs()); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var total, largest int64
	for _, l := range c.pool {
		if c.heldLocked(l.Key) || (params.Transport != "" && l.Transport != params.Transport) {
			continue
		}
		s := c.sizes.get(l.Key)
		total += s
		largest = max(largest, s)
	}
	return &csi.GetCapacityResponse{AvailableCapacity: total, MaximumVolumeSize: wrapperspb.Int64(largest)}, nil
}

// ControllerGetCapabilities: create/delete, list and capacity. No publish step (the node
// plugin logs in to the target itself, so the CSIDriver has attachRequired: false), no
// snapshots, clones or expansion (a pool LUN is what the array made it).
func (c *Controller) ControllerGetCapabilities(ctx context.Context, req *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}},
		})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}
