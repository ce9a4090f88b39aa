//go:build e2e

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/iser-blk/iser-blk/internal/chapcreds"
	"github.com/iser-blk/iser-blk/internal/csi"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/test/e2e/tgtd"
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

// TestE2ECSIPoolCHAPFromEnvironment: the controller logs in to a pool LUN whose URL names a CHAP
// user with the secret from $ISERBLK_CHAP_SECRET (what the Deployment maps from a Secret), so
// the LUN's size is read and counted; without it, the LUN is left out as unreadable.
func TestE2ECSIPoolCHAPFromEnvironment(t *testing.T) {
	tg := tgtd.Start(t, tgtd.Options{Size: 48 << 20, CHAP: &tgtd.Account{User: "pool-user", Password: "pool-s3cret-123"}})
	dir := t.TempDir()
	pool := filepath.Join(dir, "pool")
	if err := os.WriteFile(pool, []byte(fmt.Sprintf("iscsi://pool-user@%s/%s/1\n", tg.Portal, tg.Name)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		secret string
		want   int64
	}{{"pool-s3cret-123", 48 << 20}, {"", 0}} {
		t.Run(fmt.Sprintf("secret=%v", tc.secret != ""), func(t *testing.T) {
			t.Setenv(chapcreds.EnvSecret, tc.secret)
			sub := t.TempDir()
			p := startCSI(t, filepath.Join(sub, "csi.sock"), "--run-dir", filepath.Join(sub, "run"), "--pool", pool,
				"--pool-claims", filepath.Join(sub, "claims.json"), "--initiator-name", "iqn.2026-12.io.iser-blk.test:chap")
			capacity, err := csipb.NewControllerClient(p.conn).GetCapacity(p.ctx, &csipb.GetCapacityRequest{}, grpc.WaitForReady(true))
			if err != nil || capacity.GetAvailableCapacity() != tc.want {
				t.Fatalf("capacity %v %v, want %d bytes; stderr:\n%s", capacity, err, tc.want, p.stderr.String())
			}
			p.stop(t)
			if strings.Contains(p.stderr.String(), "pool-s3cret-123") {
				t.Error("the plugin logged the CHAP secret")
			}
		})
	}
}
