package iser

import (
	"errors"
	"strings"
	"testing"

	"github.com/iser-blk/iser-blk/internal/buildinfo"
)

// TestBuildInfoRDMAFeature: `iser-blk version` lists rdma exactly when this package has the
// iSER transport (the two decide it by the same build constraint, in different packages).
func TestBuildInfoRDMAFeature(t *testing.T) {
	if got, want := buildinfo.Get().Has(buildinfo.FeatureRDMA), RDMASupported(); got != want {
		t.Fatalf("buildinfo says rdma=%v, backend/iser says %v", got, want)
	}
}

func TestCheckBuiltIn(t *testing.T) {
	if err := checkBuiltIn("iscsi", "iscsi://h/iqn.2003-01.org.example:x/0"); err != nil {
		t.Errorf("iscsi: %v", err)
	}
	err := checkBuiltIn("iser", "iser://h/iqn.2003-01.org.example:x/0")
	if RDMASupported() {
		if err != nil {
			t.Errorf("iser in an RDMA build: %v", err)
		}
		return
	}
	if !errors.Is(err, ErrRDMANotBuilt) || !strings.Contains(err.Error(), "iser://h/iqn.2003-01.org.example:x/0") {
		t.Errorf("iser without RDMA: %v, want ErrRDMANotBuilt naming the URL", err)
	}
}
