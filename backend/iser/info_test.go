package iser

import (
	"bytes"
	"strings"
	"testing"
)

// TestInfoForms: the table shows sizes with their units and what was not reported; the JSON
// has the stable field names.
func TestInfoForms(t *testing.T) {
	in := Info{URL: "iscsi://h:3260/iqn.x:y/1", Vendor: "LIO-ORG", Product: "disk", Revision: "4.0", Serial: "abc",
		WWN: "naa.6001405", Capacity: 10 << 30, Blocks: 10 << 30 / 4096, LogicalBlockSize: 4096, PhysicalBlockSize: 4096,
		MaxTransfer: 8 << 20, ThinProvisioned: true, UnmapSupported: true, ZeroesAfterUnmap: true, WriteCache: false,
		WriteCacheKnown: true, FUA: true, WriteSame: "yes"}
	var b bytes.Buffer
	if err := in.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Capacity:             10737418240 bytes (10 GiB, 2621440 blocks)\n",
		"Max transfer:         8388608 bytes (8.0 MiB)\n",
		"Optimal transfer:     not reported\n",
		"Thin provisioning:    yes (unmap yes, write same unmap no, zeroes after unmap yes)\n",
		"Write cache:          disabled\n",
		"FUA:                  yes\n",
		"Read-only:            no\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := in.WriteJSON(&b); err != nil || !strings.Contains(b.String(), `"capacity_bytes": 10737418240`) {
		t.Fatalf("json %v:\n%s", err, b.String())
	}
}
