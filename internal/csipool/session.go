package csipool

// One login to a pool LUN through backend/iser, shared by the size probe (read-only) and the
// erase (read-write), so both authenticate and reach the LUN's portals the same way.

import (
	"context"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/internal/chapcreds"
)

// openLUN logs in to lun with opts, read-only or not, over every portal the pool file names for
// it. CHAP in opts may hold a secret without a user: it is then used for the LUNs whose URL names
// a user (user@host), and the others log in without CHAP.
func openLUN(ctx context.Context, opts iser.Options, lun LUN, readOnly bool) (*iser.Device, error) {
	opts.ReadOnly = readOnly
	t, err := iser.ParseURL(lun.URLs[0])
	if err != nil {
		return nil, err
	}
	if t.User == "" && opts.CHAP != nil && opts.CHAP.User == "" {
		opts.CHAP = nil
	}
	opts.AlternateTargets = lun.URLs[1:]
	return iser.Open(ctx, lun.URLs[0], opts)
}

// LoginOptions are the pool LUNs' login options for this host: its initiator name, and CHAP
// when the environment holds a secret (chapcreds.EnvSecret: the Deployment maps a Secret's key
// to it, as attach takes its secret, never argv). openLUN uses the secret only for the LUNs
// whose URL names a user.
func LoginOptions(initiatorName string) iser.Options {
	opts := iser.Options{InitiatorName: initiatorName}
	if secret := chapcreds.EnvSecretValue(); secret != "" {
		opts.CHAP = &iser.CHAP{Secret: secret}
	}
	return opts
}

// NewISER is New for a pool reached through backend/iser: c's Prober and Eraser are
// ISERProber and ISEREraser logging in with opts (LoginOptions in production).
func NewISER(c Config, opts iser.Options) (*Controller, error) {
	c.Prober = ISERProber{Options: opts}
	c.Eraser = ISEREraser{Options: opts}
	return New(c)
}
