package control

import (
	"os"
	"strings"
	"testing"
)

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
