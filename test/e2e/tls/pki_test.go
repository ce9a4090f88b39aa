//go:build e2e || vm

package tls_test

import (
	"fmt"
	"os/exec"
	"testing"
)

// certtoolScript is the certtool recipe of nbdkit-tls(1) and issue #40 (templates with cn, ca and
// cert_signing_key for the CA, tls_www_server and tls_www_client), with the key options of each
// --generate-privkey ("" for certtool's default, RSA 3072) and options for every signature. The
// server's template names 127.0.0.1 and localhost, which libnbd and qemu check.
func certtoolScript(caKey, serverKey, clientKey, sign string) string {
	return fmt.Sprintf(`set -euo pipefail
mkdir -p server client
printf 'cn = iser-blk e2e CA\nca\ncert_signing_key\n' > ca.info
printf 'cn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\ntls_www_server\n' > server.info
printf 'cn = e2e client\ntls_www_client\n' > client.info
certtool --generate-privkey %[1]s --outfile ca-key.pem
certtool --generate-self-signed --load-privkey ca-key.pem --template ca.info --outfile ca-cert.pem %[4]s
certtool --generate-privkey %[2]s --outfile server/server-key.pem
certtool --generate-certificate --load-privkey server/server-key.pem --load-ca-certificate ca-cert.pem \
    --load-ca-privkey ca-key.pem --template server.info --outfile server/server-cert.pem %[4]s
certtool --generate-privkey %[3]s --outfile client/client-key.pem
certtool --generate-certificate --load-privkey client/client-key.pem --load-ca-certificate ca-cert.pem \
    --load-ca-privkey ca-key.pem --template client.info --outfile client/client-cert.pem %[4]s
cp ca-cert.pem server/ && cp ca-cert.pem client/
`, caKey, serverKey, clientKey, sign)
}

// makePKI runs a row's script in a new directory and returns it.
func makePKI(t *testing.T, script string) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("making certificates: %v\n%s\n%s", err, script, out)
	}
	return dir
}
