package cachedev

import (
	"testing"

	"github.com/iser-blk/iser-blk/backend/memdev"
)

// The identity leaves the portal and the credentials out: the same LUN behind another portal
// (multipath, a moved target) keeps its cache; mem:// URLs are their own name.
func TestIdentity(t *testing.T) {
	d, err := memdev.ParseURL("mem://1MiB")
	if err != nil {
		t.Fatal(err)
	}
	a := Identity(d, "iscsi://user@192.0.2.1:3260/iqn.2026-12.test:t/3")
	b := Identity(d, "iser://192.0.2.9/iqn.2026-12.test:t/3")
	if a.URL != "iqn.2026-12.test:t/3" || a != b {
		t.Fatalf("identities %+v and %+v, want both iqn.2026-12.test:t/3", a, b)
	}
	if m := Identity(d, "mem://1MiB"); m.URL != "mem://1MiB" || m.WWN != "" {
		t.Fatalf("mem identity %+v", m)
	}
}
