package csipool

// CreateVolume: the request checked, the smallest free LUN that fits picked and claimed (the
// claims file written before the answer), or a wait for an erase when only a LUN being erased
// would fit. controller.go holds the Controller and the other calls.

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// capacityRange checks a capacity range: required and limit (0: none).
func capacityRange(r *csi.CapacityRange) (required, limit int64, err error) {
	required, limit = r.GetRequiredBytes(), r.GetLimitBytes()
	switch {
	case required < 0 || limit < 0:
		return 0, 0, fmt.Errorf("negative capacity range (required %d, limit %d)", required, limit)
	case limit > 0 && limit < required:
		return 0, 0, fmt.Errorf("capacity limit %d is below the required %d", limit, required)
	}
	return required, limit, nil
}

// fits reports whether size is within the range.
func fits(size, required, limit int64) bool {
	return size >= required && (limit == 0 || size <= limit)
}

// volumeOf is the CSI volume of a claim (its context copied: the response is not ours to keep).
func volumeOf(cl *Claim) *csi.Volume {
	vc := make(map[string]string, len(cl.Context))
	for k, v := range cl.Context {
		vc[k] = v
	}
	return &csi.Volume{VolumeId: cl.ID, CapacityBytes: cl.Size, VolumeContext: vc}
}

// CreateVolume claims the smallest free LUN of the pool whose size is within the capacity range
// (and of the transport the parameters ask for), or returns the volume already created under
// the name. Codes: InvalidArgument (name, capabilities, range, parameters, a content source),
// AlreadyExists (the name holds a LUN outside the range, or other parameters),
// ResourceExhausted (no free LUN fits now; one may be freed, erased or become probeable), OutOfRange (no
// LUN of the pool, free or not, could ever fit, and every size is known), Internal (the claims
// file could not be written; nothing was claimed).
func (c *Controller) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	name := req.GetName()
	if name == "" || len(name) > maxNameBytes {
		return nil, status.Errorf(codes.InvalidArgument, "volume name of %d bytes (want 1 to %d)", len(name), maxNameBytes)
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	required, limit, err := capacityRange(req.GetCapacityRange())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	params, err := ParseParameters(req.GetParameters())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if req.GetVolumeContentSource() != nil {
		return nil, status.Error(codes.InvalidArgument, "volume content sources (snapshots, clones) are not supported: a pool LUN comes as it is")
	}
	if resp, done, err := c.existing(name, required, limit, params); done {
		return resp, err
	}
	// Sizes of free LUNs not known yet are read outside c.mu (doc.go, lock order).
	if err := c.sizes.probe(ctx, c.freeLUNs()); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	wait := time.NewTimer(MaxEraseWait)
	defer wait.Stop()
	for {
		resp, erased, err := c.claim(name, required, limit, params)
		if erased == nil {
			return resp, err
		}
		// Only LUNs being erased would fit: one is free again within seconds to minutes (a CO
		// retries a ResourceExhausted, csi-sanity does not), so wait for an erase to end,
		// within the call's deadline and MaxEraseWait, and look again.
		select {
		case <-erased:
		case <-ctx.Done():
			return nil, err
		case <-wait.C:
			return nil, err
		}
	}
}

// MaxEraseWait bounds how long CreateVolume waits for an erase when only LUNs being erased
// would fit the request.
const MaxEraseWait = 2 * time.Minute

// claim records a new volume name on the best free LUN. When none is free but a LUN being
// erased would fit, erased is the channel the next freed LUN closes, beside the
// ResourceExhausted error.
func (c *Controller) claim(name string, required, limit int64, params Parameters) (resp *csi.CreateVolumeResponse, erased <-chan struct{}, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// Another call may have created the name while the LUNs were probed, or while this one waited.
	if resp, done, err := c.existingLocked(name, required, limit, params); done {
		return resp, nil, err
	}
	lun, size, err := c.pickLocked(required, limit, params.Transport)
	if err != nil {
		if status.Code(err) == codes.ResourceExhausted && c.erasingFitsLocked(required, limit, params.Transport) {
			return nil, c.erased, err
		}
		return nil, nil, err
	}
	id, err := NewVolumeID()
	if err != nil {
		return nil, nil, status.Errorf(codes.Internal, "volume ID: %v", err)
	}
	cl := &Claim{ID: id, Name: name, LUN: lun.Key, Size: size, Context: volumeContext(lun, params), Created: c.now().UTC()}
	c.byID[id], c.byName[name], c.byLUN[lun.Key] = cl, cl, cl
	if err := c.persistLocked(); err != nil {
		delete(c.byID, id)
		delete(c.byName, name)
		delete(c.byLUN, lun.Key)
		c.log.Error("claims file not written; the volume was not created", zap.String("name", name), zap.Error(err))
		return nil, nil, status.Errorf(codes.Internal, "recording the claim: %v", err)
	}
	c.log.Info("volume created", zap.String("name", name), zap.String("volume_id", id), zap.String("lun", lun.Key), zap.Int64("size", size))
	return &csi.CreateVolumeResponse{Volume: volumeOf(cl)}, nil, nil
}

// erasingFitsLocked reports whether a LUN being erased (in the pool, its last attempt not
// failed) would fit the request. c.mu is held.
func (c *Controller) erasingFitsLocked(required, limit int64, transport string) bool {
	for key, e := range c.erasing {
		l, ok := c.byKey[key]
		if ok && !c.eraseFailed[key] && (transport == "" || l.Transport == transport) && fits(e.Size, required, limit) {
			return true
		}
	}
	return false
}

// existing answers CreateVolume for a name that already holds a volume: done is false when it
// does not.
func (c *Controller) existing(name string, required, limit int64, p Parameters) (resp *csi.CreateVolumeResponse, done bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.existingLocked(name, required, limit, p)
}

// existingLocked is existing with c.mu held. The request matches when the LUN's size is in its
// range and it chooses what the volume was made with (transport, frontend, cache); the URLs are
// not compared, as the pool file may have gained a portal for the LUN since.
func (c *Controller) existingLocked(name string, required, limit int64, p Parameters) (resp *csi.CreateVolumeResponse, done bool, err error) {
	cl := c.byName[name]
	if cl == nil {
		return nil, false, nil
	}
	sameChoice := (p.Transport == "" || p.Transport == cl.Context[ContextTransport]) &&
		p.Frontend == cl.Context[ContextFrontend] && p.Cache == cl.Context[ContextCache]
	if !fits(cl.Size, required, limit) || !sameChoice {
		return nil, true, status.Errorf(codes.AlreadyExists,
			"volume %q exists (%s, %d bytes, %v) and does not match this request (capacity %d to %d, %+v)",
			name, cl.ID, cl.Size, cl.Context, required, limit, p)
	}
	return &csi.CreateVolumeResponse{Volume: volumeOf(cl)}, true, nil
}

// pickLocked chooses the smallest free LUN of known size within the range (pool order breaks
// ties), so large LUNs stay for large requests. A LUN being erased is not free: it only makes
// the answer ResourceExhausted rather than OutOfRange when it would fit. c.mu is held.
func (c *Controller) pickLocked(required, limit int64, transport string) (LUN, int64, error) {
	var best LUN
	var bestSize int64
	unknown, everFits := 0, false
	for _, l := range c.pool {
		if transport != "" && l.Transport != transport {
			continue
		}
		size := c.sizes.get(l.Key)
		if cl := c.byLUN[l.Key]; cl != nil {
			size = cl.Size
		} else if e := c.erasing[l.Key]; e != nil {
			size = e.Size
		}
		if size == 0 {
			unknown++
			continue
		}
		if !fits(size, required, limit) {
			continue
		}
		everFits = true
		if !c.heldLocked(l.Key) && (bestSize == 0 || size < bestSize) {
			best, bestSize = l, size
		}
	}
	switch {
	case bestSize > 0:
		return best, bestSize, nil
	case !everFits && unknown == 0:
		return LUN{}, 0, status.Errorf(codes.OutOfRange, "no LUN of the pool%s has a size from %d to %d bytes (%s)",
			transportNote(transport), required, limit, c.sizesLocked(transport))
	default:
		return LUN{}, 0, status.Errorf(codes.ResourceExhausted, "no free LUN of the pool%s has a size from %d to %d bytes (%d of unknown size: unreachable; %s)",
			transportNote(transport), required, limit, unknown, c.sizesLocked(transport))
	}
}

func transportNote(transport string) string {
	if transport == "" {
		return ""
	}
	return " over " + transport
}

// sizesLocked summarises the pool's sizes for an error message. c.mu is held.
func (c *Controller) sizesLocked(transport string) string {
	free, claimed, erasing := map[int64]int{}, 0, 0
	for _, l := range c.pool {
		if transport != "" && l.Transport != transport {
			continue
		}
		if c.byLUN[l.Key] != nil {
			claimed++
			continue
		}
		if c.erasing[l.Key] != nil {
			erasing++
			continue
		}
		if s := c.sizes.get(l.Key); s > 0 {
			free[s]++
		}
	}
	sizes := make([]int64, 0, len(free))
	for s := range free {
		sizes = append(sizes, s)
	}
	sort.Slice(sizes, func(i, j int) bool { return sizes[i] < sizes[j] })
	out := fmt.Sprintf("%d claimed, %d being erased; free:", claimed, erasing)
	if len(sizes) == 0 {
		out += " none"
	}
	for _, s := range sizes {
		out += fmt.Sprintf(" %d×%d", free[s], s)
	}
	return out
}
