package csipool

import (
	"slices"
	"strings"
	"testing"

	csinode "github.com/iser-blk/iser-blk/internal/csi"
)

func TestParseParameters(t *testing.T) {
	p, err := ParseParameters(map[string]string{
		"transport": "iser", "frontend": "nbd", "cache": "wt",
		"csi.storage.k8s.io/pvc/name": "data", // the CO's own: ignored
	})
	if err != nil {
		t.Fatal(err)
	}
	if p != (Parameters{Transport: "iser", Frontend: "nbd", Cache: "writethrough"}) {
		t.Fatalf("parsed %+v", p)
	}
	if p, err := ParseParameters(nil); err != nil || p != (Parameters{}) {
		t.Fatalf("no parameters: %+v, %v", p, err)
	}
	for _, bad := range []map[string]string{
		{"cahce": "off"}, {"transport": "tcp"}, {"frontend": "scsi"}, {"cache": "fast"}, {"cache": ""}, {"Frontend": "nbd"},
	} {
		if p, err := ParseParameters(bad); err == nil {
			t.Errorf("%v accepted as %+v", bad, p)
		}
	}
}

// TestVolumeContextIsTheNodes: a dynamic volume's context is read by the node plugin
// (internal/csi), whose parser is the contract; every context this controller creates must pass it.
func TestVolumeContextIsTheNodes(t *testing.T) {
	luns, err := ParsePool([]byte("iscsi://192.0.2.10/iqn.2001-04.com.example:pool/1,iscsi://192.0.2.11/iqn.2001-04.com.example:pool/1\niser://192.0.2.12/iqn.x:y/3\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, lun := range luns {
		for _, p := range []Parameters{{}, {Frontend: FrontendNBD, Cache: "off"}, {Frontend: FrontendUblk, Cache: "writethrough"}} {
			vc := volumeContext(lun, p)
			if _, err := csinode.ParseVolumeContext(vc); err != nil {
				t.Errorf("the node plugin refuses %v: %v", vc, err)
			}
		}
	}
}

func TestParseVolumeContext(t *testing.T) {
	const a, b = "iscsi://192.0.2.10/iqn.2001-04.com.example:pool/1", "iscsi://192.0.2.11/iqn.2001-04.com.example:pool/1"
	vc, err := ParseVolumeContext(map[string]string{ContextTarget: a + "," + b, ContextTransport: "iscsi", ContextFrontend: "ublk", ContextCache: "off"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(vc.URLs, []string{"iscsi://192.0.2.10:3260/iqn.2001-04.com.example:pool/1", "iscsi://192.0.2.11:3260/iqn.2001-04.com.example:pool/1"}) ||
		vc.Transport != "iscsi" || vc.Frontend != "ublk" || vc.Cache != "off" {
		t.Fatalf("parsed %+v", vc)
	}
	// A static PV may give only the target: the rest is the node's default.
	vc, err = ParseVolumeContext(map[string]string{ContextTarget: "iser://192.0.2.12/iqn.x:y/3"})
	if err != nil || vc.Transport != "iser" || vc.Frontend != "" || vc.Cache != "" {
		t.Fatalf("target only: %+v, %v", vc, err)
	}
	for _, tc := range []struct {
		name string
		c    map[string]string
		want string
	}{
		{"no target", map[string]string{ContextTransport: "iscsi"}, "is missing"},
		{"empty target", map[string]string{ContextTarget: ""}, "is missing"},
		{"bad target", map[string]string{ContextTarget: "/dev/sda"}, "attribute targets"},
		{"two LUNs", map[string]string{ContextTarget: a + ",iscsi://192.0.2.11/iqn.2001-04.com.example:pool/2"}, "not the LUN of"},
		{"transport not the scheme", map[string]string{ContextTarget: a, ContextTransport: "iser"}, "scheme is iscsi"},
		{"bad frontend", map[string]string{ContextTarget: a, ContextFrontend: "loop"}, "frontend"},
		{"empty cache", map[string]string{ContextTarget: a, ContextCache: ""}, "cache is empty"},
		{"unknown key", map[string]string{ContextTarget: a, "chap-secret": "x"}, "unknown volume attribute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vc, err := ParseVolumeContext(tc.c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParseVolumeContext = %+v, %v; want an error with %q", vc, err, tc.want)
			}
		})
	}
}
