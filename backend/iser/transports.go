package iser

// The iSER transport registers itself for "iser" URLs from its package init (a build without
// cgo/rdma-core registers a stub that fails with "built without RDMA support").
import _ "github.com/iser-blk/iser-blk/backend/iser/rdma"
