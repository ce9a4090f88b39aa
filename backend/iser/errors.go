package iser

import (
	"errors"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/rdma"
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
	// ErrNoRDMA: an iser:// URL in a binary built without cgo/rdma-core or with the nordma tag.
	ErrNoRDMA = rdma.ErrNoRDMA
)

// LoginError is a failed login: the target, the portal and the sentinel (Kind) it matches with
// errors.Is, and the underlying cause.
type LoginError = login.Error

// CHAP are CHAP credentials (RFC 7143 §12.1.3): the initiator's, and the target's for mutual
// CHAP. They travel only in Options, never in a URL or a log.
type CHAP = login.CHAP
