//go:build !cgo || !linux || nordma

package iser

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestOpenIserWithoutRDMA: a build without RDMA (the static release binary) refuses iser://
// targets at once, naming the URL without its user, and never dials: 192.0.2.1 (TEST-NET-1)
// would otherwise take the whole login timeout to fail as unreachable.
func TestOpenIserWithoutRDMA(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := Options{InitiatorName: "iqn.2016-04.com.open-iscsi:0123456789ab", LoginTimeout: 20 * time.Second}
	_, err := Open(ctx, "iser://alice@192.0.2.1/iqn.2003-01.org.example:x/0", opts)
	if !errors.Is(err, ErrRDMANotBuilt) || errors.Is(err, ErrPortalUnreachable) {
		t.Fatalf("Open: %v, want ErrRDMANotBuilt", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "iser://192.0.2.1/iqn.2003-01.org.example:x/0") || strings.Contains(msg, "alice") {
		t.Errorf("Open's error %q should name the URL without its user", msg)
	}
	_, err = Discover(ctx, "iser", "192.0.2.1:3260", opts)
	if !errors.Is(err, ErrRDMANotBuilt) {
		t.Fatalf("Discover: %v, want ErrRDMANotBuilt", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the refusal waited for the network")
	}
}
