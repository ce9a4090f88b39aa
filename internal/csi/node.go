package csi

import (
	"context"
	"sync"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Node is the CSI Node service.
type Node struct {
	csipb.UnimplementedNodeServer

	nodeID     string
	maxVolumes int64
	gateways   Gateways
	mounter    Mounter
	records    Records
	cacheDir   string // NodeOptions.CacheDevDir
	log        *zap.Logger
	locks      volumeLocks
	// admit serialises admitting a new volume (counting the records, then saving one), so that
	// concurrent stages of different volumes cannot together pass maxVolumes. It is taken
	// after the volume's lock, never before.
	admit sync.Mutex
}

// NodeOptions configure a Node.
type NodeOptions struct {
	NodeID     string // NodeGetInfo's node id: the CO's name for this node
	MaxVolumes int64  // NodeGetInfo's max_volumes_per_node; NodeStage refuses more (0: no limit)
	RunDir     string // the gateways' run directory; the records live in RUNDIR/csi
	Gateways   Gateways
	Mounter    Mounter
	// CacheDevDir holds the cache device files of volumes that ask for one (KeyCacheDevSize),
	// one per volume, named after its gateway; empty: such volumes are refused.
	CacheDevDir string
	Log         *zap.Logger
}

// NewNode returns the Node service.
func NewNode(o NodeOptions) *Node {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	return &Node{nodeID: o.NodeID, maxVolumes: o.MaxVolumes, gateways: o.Gateways, mounter: o.Mounter,
		records: RecordsIn(o.RunDir), cacheDir: o.CacheDevDir, log: o.Log}
}

// NodeGetCapabilities implements csi.NodeServer.
func (n *Node) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	var caps []*csipb.NodeServiceCapability
	for _, c := range []csipb.NodeServiceCapability_RPC_Type{
		csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csipb.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
	} {
		caps = append(caps, &csipb.NodeServiceCapability{Type: &csipb.NodeServiceCapability_Rpc{
			Rpc: &csipb.NodeServiceCapability_RPC{Type: c}}})
	}
	return &csipb.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// NodeGetInfo implements csi.NodeServer. No topology: a LUN is reachable from any node that
// reaches its portals, which the CO cannot know better than the volume's own targets.
func (n *Node) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	return &csipb.NodeGetInfoResponse{NodeId: n.nodeID, MaxVolumesPerNode: n.maxVolumes}, nil
}

// volumeLocks serialises the calls for one volume (by gateway name). A CO may send a second
// call for a volume while the first runs (a retry after its timeout); the spec's answer is
// Aborted, so the second never queues behind a mkfs or a write-back.
type volumeLocks struct {
	mu   sync.Mutex
	busy map[string]chan struct{} // closed when the holder lets go
}

// tryLock takes name's lock, or answers Aborted when a call holds it.
func (l *volumeLocks) tryLock(name string) (unlock func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, held := l.busy[name]; held {
		return nil, status.Errorf(codes.Aborted, "an operation on this volume (%s) is in progress", name)
	}
	return l.take(name), nil
}

// lock waits for name's lock (the healer: it runs once, in the background) or ctx's end.
func (l *volumeLocks) lock(ctx context.Context, name string) (unlock func(), err error) {
	for {
		l.mu.Lock()
		ch, held := l.busy[name]
		if !held {
			defer l.mu.Unlock()
			return l.take(name), nil
		}
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// take marks name held; l.mu is held.
func (l *volumeLocks) take(name string) func() {
	if l.busy == nil {
		l.busy = map[string]chan struct{}{}
	}
	ch := make(chan struct{})
	l.busy[name] = ch
	return func() {
		l.mu.Lock()
		delete(l.busy, name)
		l.mu.Unlock()
		close(ch)
	}
}
