//go:build !cgo || !linux || nordma

package rdma

import "github.com/iser-blk/iser-blk/pool"

// Counters mirrors the cgo build's resource counters; without RDMA they stay zero.
type Counters struct {
	LiveConns, LiveQPs, LiveCQs, LivePDs, LiveMRs int64
	MRRegistrations                               int64
	SendPosts, SendWRs                            int64
	RecvPosts, RecvWRs                            int64
	Completions, CQEvents                         int64
	Connections                                   int64
	CQEventsMissed                                int64
}

// Stats returns zero counters: nothing is ever registered without RDMA support.
func Stats() Counters { return Counters{} }

// SetPool does nothing without RDMA: there is no device to register the pool with.
func SetPool(*pool.Pool) error { return nil }
