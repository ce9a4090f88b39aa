//go:build cgo && linux && !nordma

package buildinfo

// rdma: this build compiles backend/iser/internal/rdma's cgo iSER transport (the same build
// constraint as its iser.go; backend/iser's TestBuildInfoRDMAFeature checks that they agree).
const rdma = true
