package iser

import (
	"context"
	"errors"
	"fmt"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/rdma"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
)

// The errors Open, NewDevice and Discover return, for callers that tell failures apart (the
// CLI's exit codes). The login and RDMA sentinels are the very values the internal packages
// return, so errors.Is matches them however deeply the error is wrapped.
var (
	// ErrLUNNotFound: the target has no such logical unit.
	ErrLUNNotFound = errors.New("logical unit not found")
	// ErrNotDisk: the logical unit is not a direct-access block device.
	ErrNotDisk = errors.New("logical unit is not a disk")
	// ErrTransportUnavailable: the URL's transport is not built in.
	ErrTransportUnavailable = errors.New("transport not available")
	// ErrRDMANotBuilt: an iser:// target given to a binary built without the iSER transport
	// (CGO_ENABLED=0, as the static release build, or the nordma tag; RDMASupported says which
	// this is). Open and Discover return it, naming the URL, before any network I/O. It is about
	// the binary, not the host: on a host without an RDMA device an RDMA build's dial fails with
	// ErrNoRDMADevice wrapped in ErrTransportUnavailable instead.
	ErrRDMANotBuilt = errors.New("this binary was built without RDMA support (cgo and rdma-core), so it cannot use iser:// targets")

	// ErrAuthFailed: CHAP failed, either way (login status class 2 detail 1, RFC 7143 §11.13.5).
	ErrAuthFailed = login.ErrAuthFailed
	// ErrAuthorization: the initiator is not allowed to log in (class 2 detail 2).
	ErrAuthorization = login.ErrAuthorization
	// ErrTargetNotFound: the portal does not know the target name (class 2 detail 3).
	ErrTargetNotFound = login.ErrTargetNotFound
	// ErrTargetRemoved: the target is gone for good (class 2 detail 4).
	ErrTargetRemoved = login.ErrTargetRemoved
	// ErrPortalUnreachable: the portal could not be reached (the dial failed).
	ErrPortalUnreachable = login.ErrPortalUnreachable
	// ErrLoginConfig: the caller's login configuration is invalid (e.g. no initiator name).
	ErrLoginConfig = login.ErrConfig
	// ErrNoRDMA: an iSER dial in a binary built without cgo/rdma-core or with the nordma tag
	// (Open and Discover refuse iser:// targets before dialing, with ErrRDMANotBuilt).
	ErrNoRDMA = rdma.ErrNoRDMA
	// ErrNoRDMADevice: an iSER dial on a host without an RDMA device (or without rdma_ucm).
	// Open wraps it in ErrTransportUnavailable; Discover returns it inside a LoginError.
	ErrNoRDMADevice = rdma.ErrNoDevice
)

// LoginError is a failed login: the target, the portal and the sentinel (Kind) it matches with
// errors.Is, and the underlying cause.
type LoginError = login.Error

// CHAP are CHAP credentials (RFC 7143 §12.1.3): the initiator's, and the target's for mutual
// CHAP. They travel only in Options, never in a URL or a log.
type CHAP = login.CHAP

// Error mapping: what a request returns wraps exactly one block sentinel.

// opError wraps a failure of op on [off, +n) so that it names the request and satisfies exactly
// one block sentinel: SCSI errors and sentinel-carrying errors keep theirs; a context error (the
// caller's context ended the wait for a path, a replay turn or the command) becomes
// block.ContextError's ErrCanceled or ErrTimeout and still matches the context error itself;
// anything else (a transport failure) becomes ErrIO. Only failed requests come here, so the
// allocations are off the hot path.
func opError(op string, off, n int64, err error) error {
	switch {
	case err == nil:
		return nil
	case hasSentinel(err):
		return fmt.Errorf("iser: %s [%d, +%d): %w", op, off, n, err)
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("iser: %s [%d, +%d): %w", op, off, n, block.ContextError(err))
	}
	return fmt.Errorf("iser: %s [%d, +%d): %w: %w", op, off, n, block.ErrIO, err)
}

var sentinels = []error{block.ErrIO, block.ErrInvalid, block.ErrReadOnly, block.ErrNoSpace,
	block.ErrNotSupported, block.ErrMedium, block.ErrTimeout, block.ErrCanceled, block.ErrClosed, block.ErrNoPath}

func hasSentinel(err error) bool {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

func isInvalidOpcode(err error) bool {
	var se *scsi.SenseError
	return errors.As(err, &se) && se.Key == scsi.KeyIllegalRequest && se.Code() == scsi.ASCInvalidOpcode
}

func isInvalidField(err error) bool {
	var se *scsi.SenseError
	return errors.As(err, &se) && se.Key == scsi.KeyIllegalRequest && se.Code() == scsi.ASCInvalidFieldInCDB
}
