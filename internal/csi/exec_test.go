package csi

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/status"
)

// The test binary doubles as `iser-blk attach` for ExecGateways: with gatewayEnv set it is a
// gateway that claims --name in --run-dir and serves its control socket ("serve"), or one that
// fails before it serves ("fail").
const gatewayEnv = "ISERBLK_CSI_TEST_GATEWAY"

func TestMain(m *testing.M) {
	if role := os.Getenv(gatewayEnv); role != "" {
		os.Exit(runTestGateway(role, os.Args[1:]))
	}
	if sock := os.Getenv(pluginEnv); sock != "" {
		os.Exit(runTestPlugin(sock, os.Getenv("RUN_DIR")))
	}
	os.Exit(m.Run())
}

// testGateway is the control Handler of the fake gateway: ready at once, detached on request.
type testGateway struct {
	reg *status.Registry
	lm  *lifecycle.Machine
}

func (g *testGateway) Status() status.Status { return g.reg.Snapshot() }

func (g *testGateway) Detach(context.Context, control.Request) (control.DetachResult, error) {
	_ = g.lm.To(lifecycle.Draining, "detach")
	_ = g.lm.To(lifecycle.Flushing, "")
	_ = g.lm.To(lifecycle.Stopped, "detached")
	return control.DetachResult{PID: os.Getpid()}, nil
}

func runTestGateway(role string, args []string) int {
	fmt.Println("test gateway:", strings.Join(args, " ")) // into the log file
	fs := flag.NewFlagSet("attach", flag.ContinueOnError)
	name := fs.String("name", "", "")
	runDir := fs.String("run-dir", "", "")
	fs.String("cache", "", "")
	fs.Bool("ublk", false, "")
	fs.String("nbd", "", "")
	fs.String("chap-user", "", "")
	chapFile := fs.String("chap-secret-file", "", "")
	var targets []string
	fs.Func("target", "", func(s string) error { targets = append(targets, s); return nil })
	if len(args) == 0 || args[0] != "attach" || fs.Parse(args[1:]) != nil {
		fmt.Fprintln(os.Stderr, "test gateway: bad command line")
		return 2
	}
	if *chapFile != "" {
		if _, err := os.ReadFile(*chapFile); err != nil {
			fmt.Fprintln(os.Stderr, "test gateway:", err)
			return 2
		}
	}
	if role == "fail" {
		fmt.Fprintln(os.Stderr, "test gateway: login failed: portal unreachable")
		return 5
	}
	c, err := control.ClaimName(*runDir, *name)
	if err != nil {
		fmt.Fprintln(os.Stderr, "test gateway:", err)
		return 2
	}
	lm := lifecycle.New()
	g := &testGateway{lm: lm, reg: status.NewRegistry(status.Identity{Name: *name, FrontendKind: modes.Ublk,
		FrontendPath: "/dev/ublkb7", Targets: targets, CacheMode: modes.WriteBack}, lm)}
	s, err := control.Listen(c, g, control.Options{Lifecycle: lm, AllowUID: func(uid uint32) bool { return int(uid) == os.Getuid() }})
	if err != nil {
		fmt.Fprintln(os.Stderr, "test gateway:", err)
		return 1
	}
	go s.Serve() //nolint:errcheck // returns at Close
	_ = lm.To(lifecycle.Ready, "")
	<-s.Detached()
	s.Close()
	c.Release()
	return 0
}

// TestExecGateways: a gateway started by ExecGateways runs in a session of its own with its
// output in its log file, is found again by a second Ensure instead of started twice, and is
// detached through its control socket; a gateway that fails before serving is an error that
// points at its log.
func TestExecGateways(t *testing.T) {
	runDir := filepath.Join(t.TempDir(), "run")
	g := &ExecGateways{Binary: os.Args[0], RunDir: runDir, Log: zap.NewNop(), HasUblk: func() bool { return true }, Poll: 10 * time.Millisecond}
	rs := RecordsIn(runDir)
	if err := rs.SaveSecret("csi-0000000000000001", SecretCHAPSecret, "s3cret"); err != nil {
		t.Fatal(err)
	}
	spec := GatewaySpec{Name: "csi-0000000000000001", Targets: []string{testTargetNorm}, CHAPUser: "alice",
		CHAPSecretFile: rs.SecretFile("csi-0000000000000001", SecretCHAPSecret)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	t.Setenv(gatewayEnv, "serve")
	st, err := g.Ensure(ctx, spec)
	if err != nil {
		t.Fatalf("ensure: %v", err)
	}
	pid := st.Gateway.PID
	t.Cleanup(func() { _ = unix.Kill(pid, unix.SIGKILL) }) // only if the test failed before its detach
	if st.Gateway.State != "ready" || st.Gateway.FrontendPath != "/dev/ublkb7" || pid == os.Getpid() {
		t.Errorf("status %+v", st.Gateway)
	}
	if sid, err := unix.Getsid(pid); err != nil || sid != pid {
		t.Errorf("gateway PID %d in session %d (%v), want its own", pid, sid, err)
	}
	st2, err := g.Ensure(ctx, spec)
	if err != nil || st2.Gateway.PID != pid {
		t.Errorf("second ensure: PID %d (%v), want the running %d", st2.Gateway.PID, err, pid)
	}
	logText, err := os.ReadFile(rs.LogFile(spec.Name))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logText), "--chap-secret-file "+spec.CHAPSecretFile) || strings.Contains(string(logText), "s3cret") {
		t.Errorf("gateway log:\n%s", logText)
	}
	if err := g.Detach(ctx, spec.Name); err != nil {
		t.Fatalf("detach: %v", err)
	}
	if _, err := g.Status(ctx, spec.Name); !errors.Is(err, control.ErrUnknownGateway) {
		t.Errorf("status after detach: %v, want no gateway", err)
	}
	if err := g.Detach(ctx, spec.Name); err != nil {
		t.Errorf("detach of a detached gateway: %v", err)
	}

	t.Setenv(gatewayEnv, "fail")
	_, err = g.Ensure(ctx, spec)
	if err == nil || !strings.Contains(err.Error(), "exited") || !strings.Contains(err.Error(), rs.LogFile(spec.Name)) {
		t.Errorf("ensure of a failing gateway: %v", err)
	}
	if logText, _ := os.ReadFile(rs.LogFile(spec.Name)); !strings.Contains(string(logText), "portal unreachable") {
		t.Errorf("the failure is not in the log:\n%s", logText)
	}
}
