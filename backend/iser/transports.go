package iser

import (
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
