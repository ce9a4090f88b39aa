package csi

import (
	"context"

	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/status"
)

// GatewaySpec is how to start one volume's gateway: `iser-blk attach` with these flags.
type GatewaySpec struct {
	Name     string
	Targets  []string       // one --target per portal
	Frontend modes.Frontend // FrontendAuto: ublk where the kernel has it, else nbd
	Cache    modes.Cache
	// CacheDev is the cache device file (--cache-dev, created at CacheDevSize when missing);
	// empty: none.
	CacheDev     string
	CacheDevSize int64
	// CHAP: the user names go on the command line (they are not secret); the secrets only as
	// files (--chap-secret-file, --target-secret-file), never argv or the environment of a
	// process that outlives the call.
	CHAPUser, CHAPSecretFile     string
	TargetUser, TargetSecretFile string
}

// Gateways runs the plugin's gateways. ExecGateways is the real one (separate processes driven
// through their control sockets); the tests use a fake.
type Gateways interface {
	// Ensure returns the status of the gateway spec.Name, starting it when none runs, once it
	// serves (state ready) or has failed (a fenced takeover, no path): both are answers, and
	// the caller reads status.Check. It fails when the gateway exits or ctx ends first.
	Ensure(ctx context.Context, spec GatewaySpec) (status.Status, error)
	// Status asks the running gateway name; an error wrapping control.ErrUnknownGateway
	// means none runs.
	Status(ctx context.Context, name string) (status.Status, error)
	// Detach stops name like `iser-blk detach` (drain, write back, remove the device) and
	// returns once its process is gone; nil when none runs. A refusal (the device is held) is a
	// *control.Error.
	Detach(ctx context.Context, name string) error
	// Waiting reports whether a kernel device of name's outlived its gateway: its state file
	// is there, so a gateway started with the name takes it over.
	Waiting(name string) bool
}
