package csi

import (
	"strings"
	"testing"

	"github.com/iser-blk/iser-blk/internal/control"
)

// TestGatewayName: every volume id, however odd, gives a valid gateway name, the same each time,
// and different ids give different names.
func TestGatewayName(t *testing.T) {
	seen := map[string]string{}
	for _, id := range []string{"a", "vol-1", "vol-2", "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789",
		"iqn.2001-04.com.example:disk1/1", "../../etc/passwd", " spaced id ", "ünïcode", strings.Repeat("x", 128)} {
		name := GatewayName(id)
		if err := control.ValidateName(name); err != nil {
			t.Errorf("%q: %v", id, err)
		}
		if !strings.HasPrefix(name, "csi-") || len(name) != 20 {
			t.Errorf("%q: name %q, want csi- and 16 hex digits", id, name)
		}
		if GatewayName(id) != name {
			t.Errorf("%q: two names", id)
		}
		if other, dup := seen[name]; dup {
			t.Errorf("%q and %q share %s", id, other, name)
		}
		seen[name] = id
	}
	// pinned: a change would orphan every gateway running under the old names
	if got, want := GatewayName("vol-1"), "csi-d2e8363faaac7ae7"; got != want {
		t.Errorf("GatewayName(vol-1) = %q, want %q", got, want)
	}
}
