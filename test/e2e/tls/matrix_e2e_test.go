//go:build e2e

package tls_test

import (
	"crypto/rand"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/test/e2e/gateway"
)

// The key-type matrix of issue #40: certificates made by certtool and openssl as users make
// them (certtool's default is RSA, which GnuTLS clients did not send in TLS 1.3 under
// --tls-verify-peer), with the real clients, in TLS 1.2 and 1.3 as the server negotiates them
// (read from its ServerHello by versionProxy, not taken on the clients' word).

// pkiRow is one way of making the certificates.
type pkiRow struct {
	name string
	// script makes server/ (ca-cert.pem, server-cert.pem, server-key.pem) and client/
	// (ca-cert.pem, client-cert.pem, client-key.pem) in the directory it runs in, with bash.
	script string
	// refusedAtStart: the gateway must not start with server/ (exit 2, naming this).
	refusedAtStart string
	// clientRefused: the client must be refused, in each TLS version, with the gateway's log
	// saying this about it.
	clientRefused map[string]string
}

// opensslScript makes the same with openssl req and x509 (PKCS#8 keys; pkcs1 converts the RSA
// ones to PKCS#1 files, "BEGIN RSA PRIVATE KEY"), with -newkey arguments for each key and
// options for every signature.
func opensslScript(caKey, serverKey, clientKey, sign string, pkcs1 bool) string {
	s := fmt.Sprintf(`set -euo pipefail
mkdir -p server client
openssl req -x509 -newkey %[1]s -nodes -days 30 -subj "/CN=iser-blk e2e CA" -keyout ca-key.pem -out ca-cert.pem %[4]s
openssl req -newkey %[2]s -nodes -subj "/CN=localhost" -keyout server/server-key.pem -out server.csr
openssl x509 -req -in server.csr -CA ca-cert.pem -CAkey ca-key.pem -days 30 -out server/server-cert.pem %[4]s \
    -extfile <(printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth')
openssl req -newkey %[3]s -nodes -subj "/CN=e2e client" -keyout client/client-key.pem -out client.csr
openssl x509 -req -in client.csr -CA ca-cert.pem -CAkey ca-key.pem -days 30 -out client/client-cert.pem %[4]s \
    -extfile <(printf 'extendedKeyUsage=clientAuth')
cp ca-cert.pem server/ && cp ca-cert.pem client/
`, caKey, serverKey, clientKey, sign)
	if pkcs1 {
		s += `for k in server/server-key.pem client/client-key.pem; do
  openssl rsa -in "$k" -traditional -out "$k.1" && mv "$k.1" "$k"
  grep -q 'BEGIN RSA PRIVATE KEY' "$k"
done
`
	}
	return s
}

// docsRecipes returns the sh blocks of docs/cli.md's "Making certificates", made to name this
// host (localhost, 127.0.0.1) instead of the example gateway.
func docsRecipes(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), "docs", "cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, "### Making certificates"), strings.Index(doc, "### Connecting")
	if i < 0 || j < i {
		t.Fatal("docs/cli.md has no \"### Making certificates\" section before \"### Connecting\"")
	}
	var out []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(doc[i:j], -1) {
		out = append(out, "set -euo pipefail\n"+strings.NewReplacer("gw1.example.com", "localhost", "192.0.2.10", "127.0.0.1").Replace(m[1]))
	}
	if len(out) != 2 {
		t.Fatalf("docs/cli.md's \"Making certificates\" has %d sh blocks, want the certtool and the openssl recipe", len(out))
	}
	return out
}

// moduleRoot is the directory of go.mod above the test's (go test runs it in its package's).
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for ; dir != "/"; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
	}
	t.Fatal("no go.mod above the test's directory")
	return ""
}

func pkiRows(t *testing.T) []pkiRow {
	const (
		rsa2048, rsa3072, rsa4096 = "--key-type=rsa --bits=2048", "--key-type=rsa --bits=3072", "--key-type=rsa --bits=4096"
		p256, p384                = "--key-type=ecdsa --curve=secp256r1", "--key-type=ecdsa --curve=secp384r1"
		rsaPSSKey                 = "--key-type=rsa-pss --bits=2048"
		oRSA2048, oRSA3072        = "rsa:2048", "rsa:3072"
		oRSA4096                  = "rsa:4096"
		oP256, oP384              = "ec -pkeyopt ec_paramgen_curve:P-256", "ec -pkeyopt ec_paramgen_curve:P-384"
		oRSAPSSKey                = "rsa-pss -pkeyopt rsa_keygen_bits:2048"
		pssSaltDigest             = "-sigopt rsa_padding_mode:pss -sigopt rsa_pss_saltlen:digest"
	)
	// The keys certtool makes by default are the RSA 3072 keys of the issue.
	const rsa3072Keys = `
for k in server/server-key.pem client/client-key.pem; do openssl pkey -in "$k" -noout -text | grep -q '^Private-Key: (3072 bit'; done
`
	docs := docsRecipes(t)
	return []pkiRow{
		{name: "issue 40 recipe with certtool defaults", script: certtoolScript("", "", "", "") + rsa3072Keys},
		{name: "docs certtool recipe", script: docs[0] + "cd ..\n" + rsa3072Keys},
		{name: "docs openssl recipe", script: docs[1]},
		{name: "certtool RSA 2048", script: certtoolScript(rsa2048, rsa2048, rsa2048, "")},
		{name: "certtool RSA 4096", script: certtoolScript(rsa4096, rsa4096, rsa4096, "")},
		{name: "certtool P-256", script: certtoolScript(p256, p256, p256, "")},
		{name: "certtool P-384", script: certtoolScript(p384, p384, p384, "")},
		{name: "certtool RSA CA with P-384 server and P-256 client", script: certtoolScript(rsa3072, p384, p256, "")},
		{name: "certtool P-256 CA with RSA 2048 server and client", script: certtoolScript(p256, rsa2048, rsa2048, "")},
		{name: "certtool RSA with RSA-PSS signatures", script: certtoolScript(rsa2048, rsa2048, rsa2048, "--sign-params=RSA-PSS")},
		{name: "openssl RSA 2048", script: opensslScript(oRSA2048, oRSA2048, oRSA2048, "", false)},
		{name: "openssl RSA 3072 in PKCS1 files", script: opensslScript(oRSA3072, oRSA3072, oRSA3072, "", true)},
		{name: "openssl RSA 4096", script: opensslScript(oRSA4096, oRSA4096, oRSA4096, "", false)},
		{name: "openssl P-384", script: opensslScript(oP384, oP384, oP384, "", false)},
		{name: "openssl RSA CA with P-256 server and RSA 2048 client", script: opensslScript(oRSA2048, oP256, oRSA2048, "", false)},
		{name: "openssl RSA with RSA-PSS signatures salted as long as the hash", script: opensslScript(oRSA2048, oRSA2048, oRSA2048, pssSaltDigest, false)},
		// What Go's TLS cannot use is refused, saying what to do instead.
		{name: "certtool RSA-PSS server key", script: certtoolScript(rsa2048, rsaPSSKey, rsa2048, ""),
			refusedAtStart: "has an RSA-PSS key (RSASSA-PSS), which Go's TLS cannot use: make an RSA key"},
		{name: "openssl RSA-PSS CA key", script: opensslScript(oRSAPSSKey, oRSA2048, oRSA2048, "", false),
			refusedAtStart: "ca-cert.pem: \"CN=iser-blk e2e CA\" has an RSA-PSS key"},
		// GnuTLS finds no signature scheme for an RSA-PSS key among the gateway's: in TLS 1.2 it
		// hangs up, in 1.3 it sends no certificate.
		{name: "certtool RSA-PSS client key", script: certtoolScript(rsa2048, rsa2048, rsaPSSKey, ""),
			clientRefused: map[string]string{"TLS1.2": `"error": "EOF"`, "TLS1.3": "client didn't provide a certificate"}},
		{name: "openssl RSA-PSS client key", script: opensslScript(oRSA2048, oRSA2048, oRSAPSSKey, "", false),
			clientRefused: map[string]string{"TLS1.2": `"error": "EOF"`, "TLS1.3": "client didn't provide a certificate"}},
		// openssl 3.0 signs RSA-PSS with the longest salt unless told otherwise: Go cannot check
		// that signature on a client certificate (and GnuTLS 3.7 calls it invalid on ours).
		{name: "openssl RSA-PSS client signature with the longest salt", script: opensslScript(oRSA2048, oRSA2048, oRSA2048, "", false) + `
openssl x509 -req -in client.csr -CA ca-cert.pem -CAkey ca-key.pem -days 30 -out client/client-cert.pem \
    -sigopt rsa_padding_mode:pss -extfile <(printf 'extendedKeyUsage=clientAuth')
openssl x509 -in client/client-cert.pem -noout -text | grep -q 'Salt Length: 0xDE'
`,
			clientRefused: map[string]string{"TLS1.2": "rsa_pss_saltlen:digest", "TLS1.3": "rsa_pss_saltlen:digest"}},
	}
}

// TestServeTLSKeyTypes runs every row of pkiRows against `serve --tls require --tls-verify-peer`:
// nbdcopy writes the export and qemu-img reads it back in TLS 1.2 and 1.3, nbdinfo connects in
// both, nbd-client lists the export (its GnuTLS handshake; /dev/nbdX needs the VM tier), and
// clients without a certificate or with one from another CA of the same name are refused.
func TestServeTLSKeyTypes(t *testing.T) {
	for _, tool := range []string{"certtool", "openssl", "nbdinfo", "nbdcopy", "qemu-img", "nbd-client"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s: %v (test/deps.sh installs it)", tool, err)
		}
	}
	for _, row := range pkiRows(t) {
		t.Run(row.name, func(t *testing.T) {
			ours, other := makePKI(t, row.script), ""
			if row.refusedAtStart == "" && row.clientRefused == nil {
				other = makePKI(t, row.script) // another CA of the same name, for a client to be refused
			}
			runRow(t, row, ours, other)
		})
	}
}

const matrixExport = 4 << 20

func runRow(t *testing.T, row pkiRow, ours, other string) {
	server, client := filepath.Join(ours, "server"), filepath.Join(ours, "client")
	target := fmt.Sprintf("mem://%d", matrixExport)
	if row.refusedAtStart != "" {
		out, code := serveExit(t, "serve", "--target", target, "--listen", "tcp://127.0.0.1:0", "--run-dir", t.TempDir(),
			"--tls", "require", "--tls-certificates", server, "--tls-verify-peer")
		if code != 2 || !strings.Contains(out, row.refusedAtStart) {
			t.Fatalf("serve: exit %d, %s\nwant exit 2 saying %q", code, out, row.refusedAtStart)
		}
		return
	}
	srv := gateway.StartListen(t, target, "tcp://127.0.0.1:0", "--tls", "require", "--tls-certificates", server, "--tls-verify-peer")
	host, port := hostPort(t, srv)
	px := startVersionProxy(t, host+":"+port)
	uri := func(dir string) string { return "nbds://" + px.addr() + "/?tls-certificates=" + url.QueryEscape(dir) }

	if row.clientRefused != nil {
		for _, v := range []string{"TLS1.2", "TLS1.3"} {
			failed := len(srv.LogLines("nbd TLS handshake failed"))
			if out, err := gnutlsCommand(t, v, "nbdinfo", "--size", uri(client)); err == nil {
				t.Errorf("nbdinfo %s got in: %s", v, out)
			}
			px.expect(t, v)
			if l := srv.WaitLog(t, "nbd TLS handshake failed", failed+1, 30*time.Second)[failed]; !strings.Contains(l, row.clientRefused[v]) {
				t.Errorf("%s refusal logged as %s, want it to say %q", v, l, row.clientRefused[v])
			}
		}
		srv.Stop(t)
		return
	}

	// Data in with nbdcopy (TLS 1.3, libnbd's default), out with qemu-img in 1.2 and 1.3.
	data := make([]byte, matrixExport)
	rand.Read(data)
	in := filepath.Join(t.TempDir(), "in.img")
	if err := os.WriteFile(in, data, 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "nbdcopy", "--flush", in, uri(client))
	px.expect(t, "TLS1.3")
	for _, v := range []string{"TLS1.2", "TLS1.3"} {
		out := filepath.Join(t.TempDir(), "out.img")
		mustRun(t, "qemu-img", "convert", "--object", "tls-creds-x509,id=tls0,endpoint=client,dir="+client+",priority="+qemuPriority[v],
			"--image-opts", fmt.Sprintf("driver=nbd,host=127.0.0.1,port=%s,tls-creds=tls0", px.port()), "-O", "raw", out)
		px.expect(t, v)
		sameFiles(t, in, out)

		got, err := gnutlsCommand(t, v, "nbdinfo", "--size", uri(client))
		if err != nil || strings.TrimSpace(string(got)) != fmt.Sprint(matrixExport) {
			t.Fatalf("nbdinfo %s: %v %q, want %d", v, err, got, matrixExport)
		}
		px.expect(t, v)
	}
	// nbd-client 3.24 fixes its priority to TLS 1.2 (NORMAL:-VERS-TLS-ALL:+VERS-TLS1.2).
	out := mustRun(t, "nbd-client", "-l", "127.0.0.1", px.port(), "-enable-tls", "-certfile", filepath.Join(client, "client-cert.pem"),
		"-keyfile", filepath.Join(client, "client-key.pem"), "-cacertfile", filepath.Join(client, "ca-cert.pem"), "-tlshostname", "127.0.0.1")
	if !regexp.MustCompile(`(?m)^iser-blk$`).Match(out) {
		t.Errorf("nbd-client -l: %s, want the export iser-blk", out)
	}
	px.expect(t, "TLS1.2")

	// Refused: no certificate, and one from another CA with the same name (the client trusts
	// ours, so it is the gateway that refuses).
	noCert, otherCA := filepath.Join(t.TempDir(), "no-cert"), filepath.Join(t.TempDir(), "other-ca")
	copyFiles(t, noCert, map[string]string{"ca-cert.pem": filepath.Join(client, "ca-cert.pem")})
	copyFiles(t, otherCA, map[string]string{"ca-cert.pem": filepath.Join(client, "ca-cert.pem"),
		"client-cert.pem": filepath.Join(other, "client", "client-cert.pem"), "client-key.pem": filepath.Join(other, "client", "client-key.pem")})
	failed := len(srv.LogLines("nbd TLS handshake failed"))
	want := []string{}
	for _, v := range []string{"TLS1.2", "TLS1.3"} {
		for dir, why := range map[string]string{noCert: "client didn't provide a certificate", otherCA: "certificate signed by unknown authority"} {
			if out, err := gnutlsCommand(t, v, "nbdinfo", "--size", uri(dir)); err == nil {
				t.Errorf("nbdinfo %s with %s got in: %s", v, filepath.Base(dir), out)
			}
			px.expect(t, v)
			want = append(want, why)
		}
	}
	logged := srv.WaitLog(t, "nbd TLS handshake failed", failed+len(want), 30*time.Second)[failed:]
	for _, why := range want {
		n := 0
		for _, l := range logged {
			if strings.Contains(l, why) {
				n++
			}
		}
		if n != 2 {
			t.Errorf("%d refusals logged saying %q, want 2 (TLS 1.2 and 1.3):\n%s", n, why, strings.Join(logged, "\n"))
		}
	}
	srv.Stop(t)
}

// qemuPriority are GnuTLS priority strings for tls-creds-x509's priority= that allow one version.
var qemuPriority = map[string]string{"TLS1.2": "NORMAL:-VERS-ALL:+VERS-TLS1.2", "TLS1.3": "NORMAL:-VERS-ALL:+VERS-TLS1.3"}

// gnutlsCommand runs a libnbd tool for TLS version v. libnbd 1.14 sets GnuTLS's "NORMAL"
// priority itself and has no setting for it. NORMAL prefers TLS 1.3; TLS 1.2 is had by taking
// 1.3 away in a GnuTLS system configuration file ([overrides] disabled-version, GnuTLS manual
// "System-wide configuration of the library"), which GnuTLS must then parse
// (GNUTLS_SYSTEM_PRIORITY_FAIL_ON_INVALID). (Taking 1.2 away the same way does not leave 1.3:
// GnuTLS 3.7 then offers only 1.1 and 1.0.) The caller checks the version with versionProxy.
func gnutlsCommand(t *testing.T, v, name string, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(name, args...)
	if v == "TLS1.2" {
		conf := filepath.Join(t.TempDir(), "gnutls.config")
		if err := os.WriteFile(conf, []byte("[overrides]\ndisabled-version = tls1.3\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd.Env = append(os.Environ(), "GNUTLS_SYSTEM_PRIORITY_FILE="+conf, "GNUTLS_SYSTEM_PRIORITY_FAIL_ON_INVALID=1")
	}
	return cmd.CombinedOutput()
}

func mustRun(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	out, err := command(name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// copyFiles makes dir with the files of from (name in dir: source path).
func copyFiles(t *testing.T, dir string, from map[string]string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, src := range from {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
