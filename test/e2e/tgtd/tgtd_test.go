//go:build e2e

package tgtd

import (
	"net"
	"strings"
	"testing"
)

// TestFixture starts two targets side by side (distinct ports and control ports), with a 4 KiB
// block size and a parameter override, and checks what tgtadm reports.
func TestFixture(t *testing.T) {
	a := Start(t, Options{Size: 8 << 20, BlockSize: 4096, Params: map[string]string{"MaxBurstLength": "131072"}})
	b := Start(t, Options{Size: 4 << 20})
	if a.Portal == b.Portal || a.ControlPort == b.ControlPort {
		t.Fatalf("targets share %s / %d", a.Portal, a.ControlPort)
	}
	show, err := a.Show()
	if err != nil {
		t.Fatal(err)
	}
	params, err := a.Params()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(show, "Block size: 4096") || !strings.Contains(show, "Size: 8 MB") ||
		!strings.Contains(params, "MaxBurstLength=131072") || !strings.Contains(show, a.Name) {
		t.Fatalf("tgtadm show:\n%s\nparams:\n%s", show, params)
	}
	for _, tg := range []*Target{a, b} {
		c, err := net.Dial("tcp", tg.Portal)
		if err != nil {
			t.Fatalf("portal %s: %v", tg.Portal, err)
		}
		c.Close()
	}
	if _, err := net.Dial("tcp", ClosedPort(t)); err == nil {
		t.Fatal("ClosedPort accepts connections")
	}
}
