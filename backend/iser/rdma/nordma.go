//go:build !cgo || !linux || nordma

package rdma

// Counters mirrors the cgo build's resource counters; without RDMA they stay zero.
type Counters struct {
	LiveConns, LiveQPs, LiveCQs, LivePDs, LiveMRs int64
	MRRegistrations                               int64
	SendPosts, SendWRs                            int64
	Connections                                   int64
}

// Stats returns zero counters: nothing is ever registered without RDMA support.
func Stats() Counters { return Counters{} }
