package control

import (
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
)

func TestValidateName(t *testing.T) {
	good := []string{"nbd0", "ublkb3", "db-1.data_2", strings.Repeat("a", MaxNameLen)}
	bad := []string{"", ".", "..", ".hidden", "-x", "_x", "a/b", "a b", "a\x00b", "ä", strings.Repeat("a", MaxNameLen+1)}
	for _, n := range good {
		if err := ValidateName(n); err != nil {
			t.Errorf("ValidateName(%q) = %v", n, err)
		}
	}
	for _, n := range bad {
		if err := ValidateName(n); err == nil {
			t.Errorf("ValidateName(%q) accepted", n)
		}
	}
}

func TestRunDirPrecedence(t *testing.T) {
	t.Setenv(RunDirEnv, "")
	if got := RunDir(""); got != DefaultRunDir {
		t.Fatalf("default %q", got)
	}
	t.Setenv(RunDirEnv, "/env/dir")
	if got := RunDir(""); got != "/env/dir" {
		t.Fatalf("env %q", got)
	}
	if got := RunDir("/flag/dir"); got != "/flag/dir" {
		t.Fatalf("flag %q", got)
	}
}

func TestClaimCreatesPrivateRunDirAndRefusesSecondClaim(t *testing.T) {
	dir := testRunDir(t)
	c, err := ClaimName(dir, "gw")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("run dir mode %v %v", fi.Mode(), err)
	}
	// flock conflicts between two open file descriptions even within one process.
	_, err = ClaimName(dir, "gw")
	var inUse *NameInUseError
	if !errors.As(err, &inUse) || inUse.PID != os.Getpid() {
		t.Fatalf("second claim: %v", err)
	}
	if !strings.Contains(err.Error(), "PID") {
		t.Fatalf("error does not name the PID: %v", err)
	}
}

func TestClaimTightensRunDirMode(t *testing.T) {
	dir := testRunDir(t)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := ClaimName(dir, "gw")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Fatalf("mode %v", fi.Mode().Perm())
	}
}

func TestReleaseRemovesFilesAndFreesName(t *testing.T) {
	dir := testRunDir(t)
	c, err := ClaimName(dir, "gw")
	if err != nil {
		t.Fatal(err)
	}
	s, err := Listen(c, newFakeGateway("gw"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	s.Close()
	if err := c.Release(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{SocketPath(dir, "gw"), LockPath(dir, "gw")} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind: %v", p, err)
		}
	}
	c2, err := ClaimName(dir, "gw")
	if err != nil {
		t.Fatalf("name not free after release: %v", err)
	}
	c2.Release()
}

// TestStaleSocketWithoutListenerIsReplaced: a socket file nobody listens on (no lock held) is
// no obstacle to a new gateway.
func TestStaleSocketWithoutListenerIsReplaced(t *testing.T) {
	dir := testRunDir(t)
	if err := EnsureRunDir(dir); err != nil {
		t.Fatal(err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: SocketPath(dir, "gw"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close() // the file stays, with no listener: what a killed process leaves
	if _, err := net.Dial("unix", SocketPath(dir, "gw")); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("precondition: dialing the stale socket gave %v", err)
	}
	c, err := ClaimName(dir, "gw")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	s, err := Listen(c, newFakeGateway("gw"), Options{AllowUID: func(uint32) bool { return true }})
	if err != nil {
		t.Fatalf("listen over a stale socket: %v", err)
	}
	s.Close()
}

// TestKilledGatewayIsStale: kill -9 of a real gateway process leaves its files; List drops it
// and removes them, and a new gateway takes the name.
func TestKilledGatewayIsStale(t *testing.T) {
	dir := testRunDir(t)
	cmd := startHelperGateway(t, dir, "gw")
	_, err := ClaimName(dir, "gw")
	var inUse *NameInUseError
	if !errors.As(err, &inUse) || inUse.PID != cmd.Process.Pid {
		t.Fatalf("claim while the child runs: %v (child PID %d)", err, cmd.Process.Pid)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if _, err := os.Stat(SocketPath(dir, "gw")); err != nil {
		t.Fatalf("precondition: the killed gateway's socket should remain: %v", err)
	}
	entries, err := List(t.Context(), dir, 0)
	if err != nil || len(entries) != 0 {
		t.Fatalf("List after kill: %+v %v", entries, err)
	}
	for _, p := range []string{SocketPath(dir, "gw"), LockPath(dir, "gw")} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("List left stale %s: %v", p, err)
		}
	}
	startHelperGateway(t, dir, "gw") // the name is usable again
}

func TestClaimAfterKillWithoutList(t *testing.T) {
	dir := testRunDir(t)
	cmd := startHelperGateway(t, dir, "gw")
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	c, err := ClaimName(dir, "gw")
	if err != nil {
		t.Fatalf("claim after kill: %v", err)
	}
	defer c.Release()
	if _, err := os.Stat(SocketPath(dir, "gw")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale socket not removed by the claim: %v", err)
	}
}
