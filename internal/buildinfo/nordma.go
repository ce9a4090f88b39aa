//go:build !cgo || !linux || nordma

package buildinfo

// rdma: this build has only backend/iser/internal/rdma's stub, which fails every iser:// dial
// (the same build constraint as its iser_nordma.go).
const rdma = false
