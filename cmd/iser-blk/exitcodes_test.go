package main

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/frontend/ublk"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/takeover"
)

// TestRDMANotBuiltExitCode: iser:// in a binary without RDMA is a usage error (2) with a hint
// naming the RDMA build; a host without an RDMA device stays 6 (the kernel lacks it).
func TestRDMANotBuiltExitCode(t *testing.T) {
	notBuilt := fmt.Errorf("iser: iser://h/iqn.2003-01.org.example:x/0: %w", iser.ErrRDMANotBuilt)
	for _, tt := range []struct {
		err  error
		code int
	}{
		{notBuilt, exitUsage},
		{fmt.Errorf("%w: %w", iser.ErrTransportUnavailable, notBuilt), exitUsage},
		{fmt.Errorf("%w: %w", iser.ErrTransportUnavailable, &iser.LoginError{Kind: iser.ErrPortalUnreachable,
			Err: fmt.Errorf("rdma_create_event_channel: %w: %w", iser.ErrNoRDMADevice, syscall.ENODEV)}), exitNoKernel},
		{&iser.LoginError{Kind: iser.ErrPortalUnreachable, Err: iser.ErrNoRDMA}, exitNoKernel},
	} {
		if got := exitCode(tt.err); got != tt.code {
			t.Errorf("exitCode(%v) = %d, want %d", tt.err, got, tt.code)
		}
	}
	if h := hint(notBuilt); !strings.Contains(h, "linux-amd64-rdma") || !strings.Contains(h, "iscsi://") {
		t.Errorf("hint %q should name the RDMA build and say iscsi:// works", h)
	}
	if got, want := rdmaBuildHint("0.9.0"), "iser-blk-0.9.0-linux-amd64-rdma"; !strings.Contains(got, want) {
		t.Errorf("hint %q does not name %s", got, want)
	}
	if h := hint(fmt.Errorf("x: %w", iser.ErrPortalUnreachable)); h != "" {
		t.Errorf("hint for an unreachable portal: %q", h)
	}
}

// TestNoResumeExitCode: a takeover refused (a corrupt, foreign or other-kind state file, a
// device not waiting) is exit 7 however deep it is wrapped, so scripts can tell it from a failure.
func TestNoResumeExitCode(t *testing.T) {
	err := fmt.Errorf("attach: %w", fmt.Errorf("%w: state file names a nbd device", takeover.ErrNoResume))
	if got := exitCode(err); got != exitNoResume {
		t.Errorf("exitCode(%v) = %d, want %d", err, got, exitNoResume)
	}
}

// TestBadNameExitCode: a --name no gateway can have is a bad argument (exit 2), like a name
// another gateway holds, however the claim wraps it.
func TestBadNameExitCode(t *testing.T) {
	for _, name := range []string{"", "bad name", "-x", strings.Repeat("a", 300)} {
		err := fmt.Errorf("claim: %w", control.ValidateName(name))
		if got := exitCode(err); got != exitUsage {
			t.Errorf("exitCode(%v) = %d, want %d", err, got, exitUsage)
		}
	}
}

// TestFrontendExitCodes: a kernel without ublk, its user recovery or nbd is exit 6 however the
// frontend wraps it; a --ublk-id in use is a usage error (2), like a name in use; a target's
// ILLEGAL REQUEST (block.ErrInvalid) is no usage error.
func TestFrontendExitCodes(t *testing.T) {
	for _, tt := range []struct {
		err  error
		code int
	}{
		{fmt.Errorf("ublk: %w", ublk.ErrNoKernel), exitNoKernel},
		{fmt.Errorf("%w: device 3 was created without it", ublk.ErrNoRecovery), exitNoKernel},
		{fmt.Errorf("attach: %w", nbd.ErrNoKernelNBD), exitNoKernel},
		{fmt.Errorf("--ublk-id: %w", fmt.Errorf("%w: /dev/ublkb7 exists already", ublk.ErrIDTaken)), exitUsage},
		{fmt.Errorf("read: %w", block.ErrInvalid), exitFailure},
	} {
		if got := exitCode(tt.err); got != tt.code {
			t.Errorf("exitCode(%v) = %d, want %d", tt.err, got, tt.code)
		}
	}
}

// TestUblkExit: how a ublk attach's end maps to exit codes: options the driver cannot take are a
// usage error (2), --ublk-id in use too (2), a LUN it cannot describe is not (1); no ublk or no
// user recovery is 6, a takeover refused 7, and a device deleted under the gateway (a control
// command's ENODEV) a plain failure (1), not "the kernel lacks it".
func TestUblkExit(t *testing.T) {
	for _, tt := range []struct {
		err  error
		code int
	}{
		{nil, exitOK},
		{fmt.Errorf("ublk: 4 queues × depth 8192 exceeds the driver's limits: %w", ublk.ErrBadOptions), exitUsage},
		{fmt.Errorf("ublk: logical block size 520 is not a power of two: %w", block.ErrInvalid), exitFailure},
		{fmt.Errorf("%w: /dev/ublkb7 exists already", ublk.ErrIDTaken), exitUsage},
		{fmt.Errorf("%w: no /dev/ublk-control", ublk.ErrNoKernel), exitNoKernel},
		{fmt.Errorf("%w: the kernel's ublk driver lacks it", ublk.ErrNoRecovery), exitNoKernel},
		{fmt.Errorf("attach --name: %w", takeover.ErrNoResume), exitNoResume},
		{fmt.Errorf("ublk: STOP_DEV: %w", syscall.ENODEV), exitFailure},
		{errors.New("ublk server failed"), exitFailure},
	} {
		if got := ublkExit(tt.err); got != tt.code {
			t.Errorf("ublkExit(%v) = %d, want %d", tt.err, got, tt.code)
		}
	}
}
