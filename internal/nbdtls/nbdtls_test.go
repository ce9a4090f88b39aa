package nbdtls_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/iser-blk/iser-blk/internal/nbdtls"
	"github.com/iser-blk/iser-blk/internal/testcerts"
)

// certDir writes a --tls-certificates directory for a server certificate valid from notBefore to
// notAfter (zero: now ± a day) and returns it with its CA.
func certDir(t *testing.T, notBefore, notAfter time.Time) (string, *testcerts.CA) {
	t.Helper()
	ca, err := testcerts.NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	p, err := ca.Server("server", notBefore, notAfter)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := testcerts.WriteDir(dir, ca, "server", p); err != nil {
		t.Fatal(err)
	}
	return dir, ca
}

// rsaPSSDirs returns two --tls-certificates directories: one whose server certificate, and one
// whose CA certificate, has an RSA-PSS key (RFC 4055 §3.1: the public key algorithm is
// id-RSASSA-PSS instead of rsaEncryption), as certtool --key-type=rsa-pss makes them. crypto/x509
// cannot make such certificates, so these are RSA certificates with the one OID changed (their
// signatures no longer match, which nothing checks before the key is refused).
func rsaPSSDirs(t *testing.T) (server, ca string) {
	t.Helper()
	c, err := testcerts.NewCAKey("test-ca", testcerts.RSA2048)
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.ServerKey("server", testcerts.RSA2048, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	toPSS := func(cert *x509.Certificate) []byte {
		rsaEncryption := []byte{0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01}
		der := bytes.Clone(cert.Raw)
		i := bytes.Index(der, cert.RawSubjectPublicKeyInfo)
		j := bytes.Index(cert.RawSubjectPublicKeyInfo, rsaEncryption)
		if i < 0 || j < 0 {
			t.Fatal("no rsaEncryption in the certificate's key")
		}
		der[i+j+len(rsaEncryption)-1] = 0x0a // 1.2.840.113549.1.1.10, id-RSASSA-PSS
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	server, ca = t.TempDir(), t.TempDir()
	for _, dir := range []string{server, ca} {
		if err := testcerts.WriteDir(dir, c, "server", p); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(server, nbdtls.CertFile), toPSS(p.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ca, nbdtls.CAFile), toPSS(c.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	return server, ca
}

// TestTLSStartupErrors: every configuration a user can fix is refused at start (the CLI's exit 2)
// with a message that names the file or flag and what is wrong.
func TestTLSStartupErrors(t *testing.T) {
	good, _ := certDir(t, time.Time{}, time.Time{})
	expired, _ := certDir(t, time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour))
	future, _ := certDir(t, time.Now().Add(time.Hour), time.Now().Add(48*time.Hour))
	mismatch, _ := certDir(t, time.Time{}, time.Time{})
	other, _ := certDir(t, time.Time{}, time.Time{})
	copyFile(t, filepath.Join(other, nbdtls.KeyFile), filepath.Join(mismatch, nbdtls.KeyFile))
	noKey, _ := certDir(t, time.Time{}, time.Time{})
	os.Remove(filepath.Join(noKey, nbdtls.KeyFile))
	noCA, _ := certDir(t, time.Time{}, time.Time{})
	os.Remove(filepath.Join(noCA, nbdtls.CAFile))
	unreadable, _ := certDir(t, time.Time{}, time.Time{})
	os.Remove(filepath.Join(unreadable, nbdtls.CertFile))
	if err := os.Mkdir(filepath.Join(unreadable, nbdtls.CertFile), 0o700); err != nil { // read fails even as root
		t.Fatal(err)
	}
	badCA, _ := certDir(t, time.Time{}, time.Time{})
	if err := os.WriteFile(filepath.Join(badCA, nbdtls.CAFile), []byte("not pem"), 0o644); err != nil {
		t.Fatal(err)
	}
	pssServer, pssCA := rsaPSSDirs(t)
	for _, tc := range []struct {
		name string
		o    nbdtls.Options
		want []string
	}{
		{"non-loopback without --tls", nbdtls.Options{Listen: "tcp://0.0.0.0:10809"}, []string{"--tls require", "--tls off"}},
		{"all addresses without --tls", nbdtls.Options{Listen: "tcp://:10809"}, []string{"reachable from other hosts"}},
		{"IPv6 any without --tls", nbdtls.Options{Listen: "tcp://[::]:10809"}, []string{"reachable from other hosts"}},
		{"bad mode", nbdtls.Options{Mode: "yes", Listen: "tcp://127.0.0.1:1"}, []string{`--tls "yes"`}},
		{"no directory", nbdtls.Options{Mode: "require", Listen: "tcp://127.0.0.1:1"}, []string{"--tls-certificates DIR"}},
		{"certificates without TLS", nbdtls.Options{CertDir: good, Listen: "tcp://127.0.0.1:1"}, []string{"need --tls on"}},
		{"missing key", nbdtls.Options{Mode: "on", CertDir: noKey, Listen: "tcp://127.0.0.1:1"}, []string{nbdtls.KeyFile, "no such file"}},
		{"unreadable certificate", nbdtls.Options{Mode: "on", CertDir: unreadable, Listen: "tcp://127.0.0.1:1"}, []string{nbdtls.CertFile, "is a directory"}},
		{"key of another certificate", nbdtls.Options{Mode: "require", CertDir: mismatch, Listen: "tcp://127.0.0.1:1"}, []string{nbdtls.KeyFile, "does not match"}},
		{"expired", nbdtls.Options{Mode: "require", CertDir: expired, Listen: "tcp://127.0.0.1:1"}, []string{nbdtls.CertFile, "expired"}},
		{"not yet valid", nbdtls.Options{Mode: "require", CertDir: future, Listen: "tcp://127.0.0.1:1"}, []string{nbdtls.CertFile, "not valid before"}},
		{"verify-peer without CA", nbdtls.Options{Mode: "require", CertDir: noCA, VerifyPeer: true, Listen: "tcp://127.0.0.1:1"}, []string{nbdtls.CAFile, "no such file"}},
		{"verify-peer with a bad CA file", nbdtls.Options{Mode: "require", CertDir: badCA, VerifyPeer: true, Listen: "tcp://127.0.0.1:1"}, []string{nbdtls.CAFile, "no PEM certificate"}},
		{"RSA-PSS server key", nbdtls.Options{Mode: "require", CertDir: pssServer, Listen: "tcp://127.0.0.1:1"}, []string{nbdtls.CertFile, "RSA-PSS key", "make an RSA key"}},
		{"RSA-PSS CA key", nbdtls.Options{Mode: "require", CertDir: pssCA, VerifyPeer: true, Listen: "tcp://127.0.0.1:1"}, []string{nbdtls.CAFile, `"CN=test-ca`, "RSA-PSS key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := nbdtls.Server(context.Background(), tc.o)
			if err == nil {
				t.Fatalf("got %v; want an error", p)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
		})
	}
}

// TestTLSPlaintextListeners: loopback and unix listeners start without TLS; --tls off on a
// non-loopback address starts with a warning.
func TestTLSPlaintextListeners(t *testing.T) {
	for _, tc := range []struct {
		o    nbdtls.Options
		warn string
	}{
		{nbdtls.Options{Listen: "tcp://127.0.0.1:10809"}, "no authentication or encryption"},
		{nbdtls.Options{Listen: "tcp://localhost:10809"}, "no authentication or encryption"},
		{nbdtls.Options{Listen: "tcp://[::1]:10809"}, "no authentication or encryption"},
		{nbdtls.Options{Listen: "unix:///run/x.sock"}, ""},
		{nbdtls.Options{Mode: "off", Listen: "tcp://0.0.0.0:10809"}, "non-loopback address (--tls off)"},
	} {
		core, logs := observer.New(zap.WarnLevel)
		tc.o.Log = zap.New(core)
		p, err := nbdtls.Server(context.Background(), tc.o)
		if err != nil || p != nil {
			t.Errorf("%s %+v: %v %v", tc.o.Listen, tc.o, p, err)
		}
		n := len(logs.FilterMessageSnippet(tc.warn).All())
		if tc.warn == "" && logs.Len() != 0 || tc.warn != "" && n != 1 {
			t.Errorf("%s %+v: warnings %v", tc.o.Listen, tc.o, logs.All())
		}
	}
}

// TestTLSReload: a reload serves the new certificate to new handshakes; a reload that fails
// (a key of another certificate) keeps the old one and says why.
func TestTLSReload(t *testing.T) {
	dir, _ := certDir(t, time.Time{}, time.Time{})
	certs, err := nbdtls.Load(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	serial := func() string { return certs.Config().Certificates[0].Leaf.SerialNumber.String() }
	first := serial()

	next, _ := certDir(t, time.Time{}, time.Time{})
	for _, name := range []string{nbdtls.CertFile, nbdtls.KeyFile} {
		copyFile(t, filepath.Join(next, name), filepath.Join(dir, name))
	}
	if err := certs.Reload(); err != nil {
		t.Fatal(err)
	}
	second := serial()
	if second == first {
		t.Fatalf("reload kept serial %s", first)
	}
	other, _ := certDir(t, time.Time{}, time.Time{})
	copyFile(t, filepath.Join(other, nbdtls.KeyFile), filepath.Join(dir, nbdtls.KeyFile))
	if err := certs.Reload(); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("reload with a key of another certificate: %v", err)
	}
	if serial() != second {
		t.Fatal("a failed reload replaced the certificate")
	}
}

// TestTLSReloadOnSIGHUP: the server's policy serves the certificates a SIGHUP re-read to new
// handshakes and logs the reload; a SIGHUP whose reload fails keeps them and logs why.
func TestTLSReloadOnSIGHUP(t *testing.T) {
	dir, _ := certDir(t, time.Time{}, time.Time{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	core, logs := observer.New(zap.InfoLevel)
	p, err := nbdtls.Server(ctx, nbdtls.Options{Mode: "require", CertDir: dir, Listen: "tcp://0.0.0.0:1", Log: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Require || p.Config.MinVersion != tls.VersionTLS12 {
		t.Fatalf("policy %+v", p)
	}
	serial := func() string {
		cfg, err := p.Config.GetConfigForClient(nil)
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Certificates[0].Leaf.SerialNumber.String()
	}
	// hup sends SIGHUP and waits for the log line the reload ends with.
	hup := func(msg string) {
		t.Helper()
		n := logs.FilterMessage(msg).Len()
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); logs.FilterMessage(msg).Len() == n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q after SIGHUP (logs %v)", msg, logs.All())
			}
		}
	}
	first := serial()
	next, _ := certDir(t, time.Time{}, time.Time{})
	for _, name := range []string{nbdtls.CertFile, nbdtls.KeyFile} {
		copyFile(t, filepath.Join(next, name), filepath.Join(dir, name))
	}
	hup("TLS certificates reloaded")
	second := serial()
	if second == first {
		t.Fatalf("reload kept serial %s", first)
	}
	other, _ := certDir(t, time.Time{}, time.Time{})
	copyFile(t, filepath.Join(other, nbdtls.KeyFile), filepath.Join(dir, nbdtls.KeyFile))
	hup("TLS certificate reload failed; keeping the old certificates")
	if serial() != second {
		t.Fatal("a failed reload replaced the certificate")
	}
	failed := logs.FilterMessage("TLS certificate reload failed; keeping the old certificates").All()
	if len(failed) != 1 || !strings.Contains(failed[0].ContextMap()["error"].(string), "does not match") {
		t.Fatalf("failed reload logged %v", logs.All())
	}
}

func TestTLSURI(t *testing.T) {
	for mode, want := range map[string]string{"": "nbd://127.0.0.1:1/", "off": "nbd://127.0.0.1:1/", "on": "nbds://127.0.0.1:1/", "require": "nbds://127.0.0.1:1/"} {
		if got := (nbdtls.Options{Mode: mode}).URI("nbd://127.0.0.1:1/"); got != want {
			t.Errorf("--tls %q: %s, want %s", mode, got, want)
		}
	}
	if got := (nbdtls.Options{Mode: "on"}).URI("nbd+unix:///?socket=/s"); got != "nbds+unix:///?socket=/s" {
		t.Errorf("unix: %s", got)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// gnutlsClientCertificate picks the client certificate the way GnuTLS 3.7 does (libnbd, qemu and
// nbd-client all load one certificate into GnuTLS), so that these tests see what those clients
// see without running them. GnuTLS (lib/auth/cert.c find_x509_client_cert) sends its one
// certificate as is when the CertificateRequest lists no certificate_authorities. When it does
// list some, GnuTLS sends the certificate only if the issuer of a certificate in its chain is
// listed AND its key's algorithm is among the "public key algorithms" it derives from the
// request: in TLS 1.2 from the certificate_types (rsa_sign: RSA, ecdsa_sign: ECDSA), in TLS 1.3
// from signature_algorithms (lib/tls13/certificate_request.c), where rsa_pss_rsae_* count as
// RSA-PSS and only rsa_pkcs1_* count as RSA. Otherwise it answers with an empty Certificate
// message. saw gets every request.
func gnutlsClientCertificate(pair tls.Certificate, saw func(*tls.CertificateRequestInfo)) func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if saw != nil {
			saw(cri)
		}
		if len(cri.AcceptableCAs) == 0 {
			return &pair, nil
		}
		pks := map[string]bool{}
		for _, s := range cri.SignatureSchemes {
			switch s {
			case tls.PKCS1WithSHA256, tls.PKCS1WithSHA384, tls.PKCS1WithSHA512, tls.PKCS1WithSHA1:
				pks["RSA"] = true
			case tls.PSSWithSHA256, tls.PSSWithSHA384, tls.PSSWithSHA512:
				// Go's TLS 1.2 client lists these only when rsa_sign was in certificate_types.
				pks["RSA-PSS"], pks["RSA"] = true, pks["RSA"] || cri.Version == tls.VersionTLS12
			case tls.ECDSAWithP256AndSHA256, tls.ECDSAWithP384AndSHA384, tls.ECDSAWithP521AndSHA512, tls.ECDSAWithSHA1:
				pks["ECDSA"] = true
			}
		}
		alg := map[x509.PublicKeyAlgorithm]string{x509.RSA: "RSA", x509.ECDSA: "ECDSA"}[pair.Leaf.PublicKeyAlgorithm]
		for _, der := range pair.Certificate { // the issuer of any certificate of the chain
			c, err := x509.ParseCertificate(der)
			if err != nil {
				return nil, err
			}
			for _, dn := range cri.AcceptableCAs {
				if bytes.Equal(dn, c.RawIssuer) && pks[alg] {
					return &pair, nil
				}
			}
		}
		return &tls.Certificate{}, nil
	}
}

// handshake runs one TLS handshake over loopback TCP between a server with srv and a client with
// cli, and returns the server's view of it: its connection state and its handshake error.
func handshake(t *testing.T, srv, cli *tls.Config) (tls.ConnectionState, error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type result struct {
		cs  tls.ConnectionState
		err error
	}
	done := make(chan result, 1)
	go func() {
		nc, err := l.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer nc.Close()
		_ = nc.SetDeadline(time.Now().Add(time.Minute))
		tc := tls.Server(nc, srv)
		err = tc.Handshake()
		done <- result{tc.ConnectionState(), err}
	}()
	nc, err := net.DialTimeout("tcp", l.Addr().String(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(time.Minute))
	tc := tls.Client(nc, cli)
	// In TLS 1.3 the client's handshake ends before the server has judged its certificate
	// (RFC 8446 §4.4.2.4): the server's answer is what counts. Reading until the server hangs up
	// also takes in its session tickets (§4.6.1), for the resumption test.
	if tc.Handshake() == nil {
		_, _ = io.Copy(io.Discard, tc)
	}
	r := <-done
	return r.cs, r.err
}

// verifyPeerServer writes a --tls-certificates directory for ca with a server certificate of key
// type k and loads it as `--tls require --tls-verify-peer` does.
func verifyPeerServer(t *testing.T, ca *testcerts.CA, k testcerts.Key) *tls.Config {
	t.Helper()
	sp, err := ca.ServerKey("server", k, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := testcerts.WriteDir(dir, ca, "server", sp); err != nil {
		t.Fatal(err)
	}
	certs, err := nbdtls.Load(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	return certs.Config()
}

func clientConfig(t *testing.T, ca *testcerts.CA, vers uint16, p testcerts.Pair, saw func(*tls.CertificateRequestInfo)) *tls.Config {
	t.Helper()
	cert, err := p.TLS()
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", MinVersion: vers, MaxVersion: vers,
		GetClientCertificate: gnutlsClientCertificate(cert, saw)}
}

var tlsVersions = map[string]uint16{"TLS1.2": tls.VersionTLS12, "TLS1.3": tls.VersionTLS13}

// TestTLSVerifyPeerGnuTLSClients (issue #40): under --tls-verify-peer, a client that chooses its
// certificate as GnuTLS does gets in with RSA and ECDSA keys alike, in TLS 1.2 and 1.3, under a
// CA and server with RSA keys (certtool's default). Before the fix the server listed its CA in
// the TLS 1.3 CertificateRequest with no rsa_pkcs1_* in signature_algorithms, so a GnuTLS client
// with an RSA key sent no certificate ("tls: client didn't provide a certificate").
func TestTLSVerifyPeerGnuTLSClients(t *testing.T) {
	ca, err := testcerts.NewCAKey("test-ca", testcerts.RSA2048)
	if err != nil {
		t.Fatal(err)
	}
	srv := verifyPeerServer(t, ca, testcerts.RSA2048)
	for _, k := range []testcerts.Key{testcerts.RSA2048, testcerts.P256, testcerts.P384} {
		p, err := ca.ClientKey("client-"+string(k), k)
		if err != nil {
			t.Fatal(err)
		}
		for name, vers := range tlsVersions {
			t.Run(string(k)+"/"+name, func(t *testing.T) {
				asked := 0
				cs, err := handshake(t, srv, clientConfig(t, ca, vers, p, func(*tls.CertificateRequestInfo) { asked++ }))
				if err != nil {
					t.Fatalf("server: %v", err)
				}
				if asked != 1 || cs.Version != vers {
					t.Fatalf("certificate requested %d times, version %x; want once, %x", asked, cs.Version, vers)
				}
				if len(cs.PeerCertificates) == 0 || !cs.PeerCertificates[0].Equal(p.Cert) {
					t.Fatalf("server saw client certificates %v, want %s", cs.PeerCertificates, p.Cert.Subject)
				}
			})
		}
	}
}

// TestTLSVerifyPeerRefuses: without the CA list in the CertificateRequest the server still
// refuses what RequireAndVerifyClientCert refused: no certificate, one from another CA, one whose
// extended key usage is not client authentication, an expired one; and it still accepts a
// certificate from an intermediate CA the client sends along.
func TestTLSVerifyPeerRefuses(t *testing.T) {
	ca, err := testcerts.NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	other, err := testcerts.NewCA("test-ca") // the same name: only the signature tells them apart
	if err != nil {
		t.Fatal(err)
	}
	srv := verifyPeerServer(t, ca, testcerts.P256)
	issue := func(ca *testcerts.CA, eku x509.ExtKeyUsage, notBefore, notAfter time.Time) testcerts.Pair {
		p, err := ca.Issue(&x509.Certificate{Subject: pkix.Name{CommonName: "client"}, ExtKeyUsage: []x509.ExtKeyUsage{eku}},
			testcerts.P256, notBefore, notAfter)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// An intermediate CA: its certificate goes along with the client's (RFC 8446 §4.4.2).
	ip, err := ca.Issue(&x509.Certificate{Subject: pkix.Name{CommonName: "intermediate"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}, testcerts.P256, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	ik, err := ip.TLS()
	if err != nil {
		t.Fatal(err)
	}
	viaIntermediate := issue(&testcerts.CA{Cert: ip.Cert, Key: ik.PrivateKey.(crypto.Signer)}, x509.ExtKeyUsageClientAuth, time.Time{}, time.Time{})
	viaIntermediate.CertPEM = append(viaIntermediate.CertPEM, ip.CertPEM...)

	for _, tc := range []struct {
		name   string
		client *testcerts.Pair // nil: no certificate
		want   string          // "" to be let in
	}{
		{"no certificate", nil, "didn't provide a certificate"},
		{"another CA", ptr(issue(other, x509.ExtKeyUsageClientAuth, time.Time{}, time.Time{})), "unknown authority"},
		{"server-only usage", ptr(issue(ca, x509.ExtKeyUsageServerAuth, time.Time{}, time.Time{})), "incompatible key usage"},
		{"expired", ptr(issue(ca, x509.ExtKeyUsageClientAuth, time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour))), "expired"},
		{"via an intermediate", &viaIntermediate, ""},
	} {
		for name, vers := range tlsVersions {
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				cli := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", MinVersion: vers, MaxVersion: vers}
				if tc.client != nil {
					cli = clientConfig(t, ca, vers, *tc.client, nil)
				}
				cs, err := handshake(t, srv, cli)
				switch {
				case tc.want == "" && err != nil:
					t.Fatalf("refused: %v", err)
				case tc.want == "" && (len(cs.PeerCertificates) != 2 || !cs.PeerCertificates[0].Equal(tc.client.Cert)):
					t.Fatalf("server saw %d certificates", len(cs.PeerCertificates))
				case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
					t.Fatalf("got %v, want a refusal saying %q", err, tc.want)
				}
			})
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestTLSVerifyPeerResumption: a TLS 1.3 client resumes its session (RFC 8446 §2.2) with the
// certificate it authenticated with, and the server checks that certificate again on the
// resumed handshake (VerifyConnection runs on every handshake).
func TestTLSVerifyPeerResumption(t *testing.T) {
	ca, err := testcerts.NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	srv := verifyPeerServer(t, ca, testcerts.P256).Clone()
	verify := srv.VerifyConnection
	checked := 0
	srv.VerifyConnection = func(cs tls.ConnectionState) error { checked++; return verify(cs) }
	p, err := ca.Client("client")
	if err != nil {
		t.Fatal(err)
	}
	cli := clientConfig(t, ca, tls.VersionTLS13, p, nil)
	cli.ClientSessionCache = tls.NewLRUClientSessionCache(1)
	for i, resumed := range []bool{false, true} {
		cs, err := handshake(t, srv, cli)
		if err != nil {
			t.Fatalf("handshake %d: %v", i, err)
		}
		if cs.DidResume != resumed || checked != i+1 || len(cs.PeerCertificates) != 1 || !cs.PeerCertificates[0].Equal(p.Cert) {
			t.Fatalf("handshake %d: resumed %v, checked %d times, peer %v", i, cs.DidResume, checked, cs.PeerCertificates)
		}
	}
}

// TestTLSVerifyPeerRSAPSSSignatures: a client certificate signed with RSA-PSS (certtool
// --sign-params RSA-PSS; salt as long as the hash) gets in. One whose PSS salt is longer
// (openssl 3.0's default) cannot be checked by crypto/x509 and is refused, with a log that says
// how to sign it instead.
func TestTLSVerifyPeerRSAPSSSignatures(t *testing.T) {
	ca, err := testcerts.NewCAKey("test-ca", testcerts.RSA2048)
	if err != nil {
		t.Fatal(err)
	}
	srv := verifyPeerServer(t, ca, testcerts.P256)
	p, err := ca.Issue(&x509.Certificate{Subject: pkix.Name{CommonName: "client"}, SignatureAlgorithm: x509.SHA256WithRSAPSS,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, testcerts.P256, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Cert.SignatureAlgorithm != x509.SHA256WithRSAPSS {
		t.Fatalf("signed with %v", p.Cert.SignatureAlgorithm)
	}
	// The saltLength of RFC 4055's RSASSA-PSS-params, [2] INTEGER 32, made 33 in both of the
	// certificate's AlgorithmIdentifiers.
	salt32 := []byte{0xa2, 0x03, 0x02, 0x01, 0x20}
	long := p
	der := bytes.ReplaceAll(p.Cert.Raw, salt32, []byte{0xa2, 0x03, 0x02, 0x01, 0x21})
	if bytes.Count(p.Cert.Raw, salt32) != 2 {
		t.Fatalf("%d salt lengths in the certificate", bytes.Count(p.Cert.Raw, salt32))
	}
	long.CertPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	for name, vers := range tlsVersions {
		if _, err := handshake(t, srv, clientConfig(t, ca, vers, p, nil)); err != nil {
			t.Errorf("%s, salt as long as the hash: %v", name, err)
		}
		_, err := handshake(t, srv, clientConfig(t, ca, vers, long, nil))
		if err == nil || !strings.Contains(err.Error(), "rsa_pss_saltlen:digest") {
			t.Errorf("%s, longer salt: %v, want a refusal naming rsa_pss_saltlen:digest", name, err)
		}
	}
}
