package control

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// serveInProcess claims name and serves g in this process until the test ends.
func serveInProcess(t *testing.T, dir, name string, g *fakeGateway, opts Options) *Server {
	t.Helper()
	c, err := ClaimName(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Lifecycle == nil {
		opts.Lifecycle = g.lm
	}
	s, err := Listen(c, g, opts)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		c.Release()
	})
	return s
}

// rawConn sends lines and reads reply lines on one connection.
type rawConn struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

func dialRaw(t *testing.T, dir, name string) *rawConn {
	conn, err := net.Dial("unix", SocketPath(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &rawConn{t: t, conn: conn, r: bufio.NewReader(conn)}
}

func (c *rawConn) send(line string) Reply {
	c.t.Helper()
	if _, err := c.conn.Write([]byte(line + "\n")); err != nil {
		c.t.Fatal(err)
	}
	return c.read()
}

func (c *rawConn) read() Reply {
	c.t.Helper()
	line, err := c.r.ReadBytes('\n')
	if err != nil {
		c.t.Fatalf("read reply: %v", err)
	}
	var r Reply
	if err := json.Unmarshal(line, &r); err != nil {
		c.t.Fatalf("reply %q: %v", line, err)
	}
	if r.Version != ProtocolVersion {
		c.t.Fatalf("reply without version: %s", line)
	}
	return r
}

func wantError(t *testing.T, r Reply, code string) {
	t.Helper()
	if r.Type != ReplyError || r.Error == nil || r.Error.Code != code {
		t.Fatalf("got %+v (error %+v), want error %s", r, r.Error, code)
	}
}

func TestSocketIsRootOnly(t *testing.T) {
	dir := testRunDir(t)
	serveInProcess(t, dir, "gw", newFakeGateway("gw"), Options{})
	fi, err := os.Stat(SocketPath(dir, "gw"))
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket mode %v %v", fi.Mode(), err)
	}
	if fileUID(fi) != os.Geteuid() {
		t.Fatalf("socket owner %d", fileUID(fi))
	}
}

// TestBadRequestsKeepTheServerServing: each bad request gets its error and the same
// connection then answers a good one.
func TestBadRequestsKeepTheServerServing(t *testing.T) {
	dir := testRunDir(t)
	serveInProcess(t, dir, "gw", newFakeGateway("gw"), Options{})
	c := dialRaw(t, dir, "gw")
	wantError(t, c.send(`{"version":1,"op":`), CodeBadRequest)
	wantError(t, c.send(`not json`), CodeBadRequest)
	wantError(t, c.send(`{"version":1,"op":"status"} {}`), CodeBadRequest)
	wantError(t, c.send(`{"version":1,"op":"status","bogus":1}`), CodeBadRequest)
	wantError(t, c.send(`{"version":2,"op":"status"}`), CodeUnsupportedVersion)
	wantError(t, c.send(`{"op":"status"}`), CodeUnsupportedVersion)
	wantError(t, c.send(`{"version":1,"op":"format-disk"}`), CodeUnknownOp)
	wantError(t, c.send(`{"version":1,"op":"restart"}`), CodeUnsupported)
	wantError(t, c.send(`{"version":1,"op":"detach","timeout_ms":-1}`), CodeBadRequest)
	r := c.send(`{"version":1,"op":"status"}`)
	if r.Type != ReplyStatus || r.Status.Gateway.Name != "gw" || r.Status.Version != 1 {
		t.Fatalf("status after bad requests: %+v", r)
	}
}

func TestOversizedRequestIsRefused(t *testing.T) {
	dir := testRunDir(t)
	serveInProcess(t, dir, "gw", newFakeGateway("gw"), Options{})
	c := dialRaw(t, dir, "gw")
	big := `{"version":1,"op":"status","x":"` + strings.Repeat("a", MaxRequestBytes) + `"}`
	wantError(t, c.send(big), CodeTooLarge)
	// The server still serves new connections.
	if st, err := (&Client{Name: "gw", socket: SocketPath(dir, "gw")}).Status(t.Context()); err != nil || st.Gateway.Name != "gw" {
		t.Fatalf("status after an oversized request: %v", err)
	}
}

func TestPeerCredentialsAreChecked(t *testing.T) {
	dir := testRunDir(t)
	seen := make(chan uint32, 1)
	serveInProcess(t, dir, "gw", newFakeGateway("gw"), Options{AllowUID: func(uid uint32) bool {
		seen <- uid
		return false
	}})
	c := dialRaw(t, dir, "gw")
	wantError(t, c.read(), CodeForbidden)
	if uid := <-seen; uid != uint32(os.Geteuid()) {
		t.Fatalf("AllowUID saw uid %d, want ours, %d", uid, os.Geteuid())
	}
}

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
