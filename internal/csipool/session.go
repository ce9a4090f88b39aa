package csipool

// One login to a pool LUN through backend/iser, shared by the size probe (read-only) and the
// erase (read-write), so both authenticate and reach the LUN's portals the same way.

import (
	"context"

	"github.com/iser-blk/iser-blk/backend/iser"
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
