package control

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestUnprivilegedUserCannotConnect runs a client as nobody (uid 65534): the 0700 run
// directory stops it, and with the directory opened up (a misconfiguration), the 0600 socket
// still does.
func TestUnprivilegedUserCannotConnect(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root to switch to nobody (the CI and dev hosts run tests as root)")
	}
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} { // t.TempDir's parent is 0700 too
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(base, "control.test")
	copyExecutable(t, os.Args[0], bin)
	dir := filepath.Join(base, "run")
	serveInProcess(t, dir, "gw", newFakeGateway("gw"), Options{})
	dialAsNobody := func() string {
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), helperEnv+"=dial", "SOCKET="+SocketPath(dir, "gw"))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("dial as nobody: %v, output %q", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if got := dialAsNobody(); got != "denied" {
		t.Fatalf("through the 0700 run dir: %s", got)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := dialAsNobody(); got != "denied" {
		t.Fatalf("through the 0600 socket: %s", got)
	}
}

func copyExecutable(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

func runHelperDial(socket string) int {
	conn, err := net.Dial("unix", socket)
	if err != nil {
		if errorsIsPerm(err) {
			fmt.Println("denied")
			return 0
		}
		fmt.Println("dial:", err)
		return 1
	}
	conn.Close()
	fmt.Println("connected")
	return 3
}

func errorsIsPerm(err error) bool {
	return strings.Contains(err.Error(), syscall.EACCES.Error())
}
