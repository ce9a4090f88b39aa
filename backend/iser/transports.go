package iser

import (
	"fmt"

	"github.com/iser-blk/iser-blk/backend/iser/internal/rdma"
	"github.com/iser-blk/iser-blk/pool"
)

// The iSER transport registers itself for "iser" URLs from its package init (a build without
// cgo/rdma-core registers a stub whose dial fails with ErrNoRDMA), so importing rdma here is
// what makes iser:// work.

// UsePool makes p the pool whose buffers iSER connections hand to the target without a copy
// (registered with every live and later connection; requests in other memory bounce through
// it). A frontend or cache calls it with the pool its buffers come from, before or after Open.
// UsePool(nil) only stops later connections from using the previous pool. Without RDMA support
// it does nothing. The error is a failed memory registration.
func UsePool(p *pool.Pool) error { return rdma.SetPool(p) }

// RDMASupported reports whether this binary has the iSER transport: built with cgo and
// rdma-core, without the nordma tag. Without it, iser:// targets fail with ErrRDMANotBuilt.
func RDMASupported() bool { return rdma.Available }

// checkBuiltIn refuses a transport this binary lacks before anything touches the network.
func checkBuiltIn(scheme, what string) error {
	if scheme == "iser" && !rdma.Available {
		return fmt.Errorf("iser: %s: %w", what, ErrRDMANotBuilt)
	}
	return nil
}
