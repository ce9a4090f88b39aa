package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/frontend/ublk"
	"github.com/iser-blk/iser-blk/internal/buildinfo"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/stack"
	"github.com/iser-blk/iser-blk/internal/takeover"
)

// Exit codes, documented in the README. Scripts may rely on them.
const (
	exitOK          = 0 // success
	exitFailure     = 1 // any other failure (I/O error, flush failed, ...)
	exitUsage       = 2 // bad flags or arguments; the gateway name is held by a running gateway
	exitAuth        = 3 // CHAP authentication failed
	exitNotFound    = 4 // target or LUN not found
	exitUnreachable = 5 // portal unreachable (refused, no route, timeout)
	exitNoKernel    = 6 // the kernel lacks what the command needs (nbd, ublk, RDMA)
	exitNoResume    = 7 // attach --name: the device cannot be taken over (state file, device state)
)

// exitCode maps an error to the documented exit codes (exitcodes.go).
func exitCode(err error) int {
	var ue *usageError
	var inUse *control.NameInUseError
	var badName *control.BadNameError
	var badStack *stack.ConfigError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue), errors.As(err, &inUse), errors.As(err, &badName), errors.As(err, &badStack), errors.Is(err, iser.ErrBadURL), errors.Is(err, iser.ErrLoginConfig),
		errors.Is(err, iser.ErrRDMANotBuilt), errors.Is(err, ublk.ErrIDTaken), errors.Is(err, ublk.ErrBadOptions):
		// ErrRDMANotBuilt: iser:// given to the static build is this binary's limit, not the
		// host's (exit 6 is for a host without an RDMA device). ErrIDTaken: --ublk-id names a
		// device that exists, as a name in use does. ErrBadOptions: --queues, --depth, --max-io
		// or --buffer-memory the driver cannot take; a LUN it cannot describe is block.ErrInvalid
		// alone, like a target's ILLEGAL REQUEST, and no usage error.
		return exitUsage
	case errors.Is(err, iser.ErrAuthFailed), errors.Is(err, iser.ErrAuthorization):
		return exitAuth
	case errors.Is(err, iser.ErrTargetNotFound), errors.Is(err, iser.ErrTargetRemoved), errors.Is(err, iser.ErrLUNNotFound):
		return exitNotFound
	case errors.Is(err, iser.ErrTransportUnavailable), errors.Is(err, iser.ErrNoRDMA), errors.Is(err, iser.ErrNoRDMADevice),
		errors.Is(err, ublk.ErrNoKernel), errors.Is(err, ublk.ErrNoRecovery), errors.Is(err, nbd.ErrNoKernelNBD):
		// A build without rdma-core, or no RDMA device: checked before "unreachable", which
		// the login layer also reports for these dial failures.
		return exitNoKernel
	case errors.Is(err, iser.ErrPortalUnreachable):
		return exitUnreachable
	case errors.Is(err, takeover.ErrNoResume):
		return exitNoResume
	}
	return exitFailure
}

// fail prints err for the user, with what to do about it where there is something, and returns
// its exit code.
func fail(name string, err error) int {
	fmt.Fprintf(os.Stderr, "iser-blk %s: %v\n", name, err)
	if h := hint(err); h != "" {
		fmt.Fprintf(os.Stderr, "iser-blk %s: %s\n", name, h)
	}
	return exitCode(err)
}

// hint is the advice fail adds to err, "" for none.
func hint(err error) string {
	if errors.Is(err, iser.ErrRDMANotBuilt) {
		return rdmaBuildHint(buildinfo.Version())
	}
	return ""
}

// rdmaBuildHint names the build that has what the static one lacks: make dist's
// iser-blk-VERSION-linux-amd64-rdma (it needs rdma-core's libibverbs and librdmacm at run time).
func rdmaBuildHint(version string) string {
	return "iser:// needs the RDMA build, iser-blk-" + version + "-linux-amd64-rdma (cgo, with rdma-core's " +
		"libibverbs and librdmacm installed), or a build from source with cgo and rdma-core; iscsi:// targets work with this binary"
}
