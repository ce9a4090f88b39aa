package iser

import (
	"context"
	"fmt"

	"github.com/iser-blk/iser-blk/backend/iser/internal/discovery"
	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
)

// DiscoveredTarget is one target a SendTargets answer names, with its portals.
type DiscoveredTarget = discovery.Target

// Portal is one portal of a DiscoveredTarget: host:port and its target portal group tag.
type Portal = discovery.Portal

// Discover runs a SendTargets discovery session (RFC 7143 §4.3) against portal (host:port) over
// the transport scheme ("iscsi" or "iser") and returns the targets it lists, sorted by name.
// It uses opts' InitiatorName, CHAP, LoginTimeout and Logger.
func Discover(ctx context.Context, scheme, portal string, opts Options) ([]DiscoveredTarget, error) {
	if err := checkBuiltIn(scheme, scheme+"://"+portal); err != nil {
		return nil, err
	}
	dialer, err := transport.Lookup(scheme)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTransportUnavailable, err)
	}
	return discovery.SendTargets(ctx, discovery.Config{
		Portal:        portal,
		Transport:     dialer,
		InitiatorName: opts.InitiatorName,
		CHAP:          opts.CHAP,
		LoginTimeout:  opts.LoginTimeout,
		Logger:        opts.Logger,
	})
}
