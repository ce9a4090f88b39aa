//go:build e2e

package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/internal/csi"
	"github.com/iser-blk/iser-blk/internal/modes"
)

// TestE2ECSIGatewayCommandLine: the attach command line the CSI plugin builds is one the real
// binary accepts — CHAP user and secret file, several portals, the cache mode, nbd — so the
// gateway gets past its flags (a mistake there is exit 2) to the kernel: on this host tier,
// which cannot load nbd, exit 6 before any login (exit 5 where nbd is there: the portal is
// closed). Its log file holds why, and never the secret.
func TestE2ECSIGatewayCommandLine(t *testing.T) {
	runDir := filepath.Join(t.TempDir(), "run")
	rs := csi.RecordsIn(runDir)
	name := csi.GatewayName("e2e-volume")
	if err := rs.SaveSecret(name, csi.SecretCHAPSecret, "e2e-s3cret"); err != nil {
		t.Fatal(err)
	}
	g := &csi.ExecGateways{Binary: iserBlkBin(t), RunDir: runDir, Log: zap.NewNop(), HasUblk: func() bool { return false }}
	spec := csi.GatewaySpec{Name: name, Frontend: csi.FrontendAuto, Cache: modes.WriteThrough,
		Targets:  []string{"iscsi://127.0.0.1:1/iqn.2026-01.test:csi/1", "iscsi://127.0.0.2:1/iqn.2026-01.test:csi/1"},
		CHAPUser: "alice", CHAPSecretFile: rs.SecretFile(name, csi.SecretCHAPSecret)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := g.Ensure(ctx, spec)
	logText, _ := os.ReadFile(rs.LogFile(name))
	t.Logf("ensure: %v\ngateway log:\n%s", err, logText)
	want := "exit status 6"
	if _, nbdLoaded := os.Stat("/sys/module/nbd"); nbdLoaded == nil {
		want = "exit status 5"
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("ensure: %v, want the gateway to end with %s", err, want)
	}
	if strings.Contains(string(logText), "e2e-s3cret") {
		t.Error("the gateway log holds the CHAP secret")
	}
	if want == "exit status 6" && !strings.Contains(string(logText), "nbd") {
		t.Error("the gateway log does not say the kernel lacks nbd")
	}
}
