//go:build e2e

package discovery

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/iser-blk/iser-blk/test/e2e/tgtd"
)

func TestE2ESendTargets(t *testing.T) {
	tg := tgtd.Start(t, tgtd.Options{Size: 4 << 20})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	targets, err := SendTargets(ctx, Config{Portal: tg.Portal, InitiatorName: "iqn.2026-11.io.iser-blk:e2e-discovery",
		Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if len(targets) != 1 || targets[0].Name != tg.Name {
		t.Fatalf("targets = %+v, want %s", targets, tg.Name)
	}
	found := false
	for _, p := range targets[0].Portals {
		if p.Address == tg.Portal {
			found = true
		}
	}
	if !found {
		t.Fatalf("portals %+v do not include %s", targets[0].Portals, tg.Portal)
	}
	t.Logf("discovered %+v", targets)
}
