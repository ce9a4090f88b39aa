package nbdtls

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// Certificates is a loaded --tls-certificates directory: the server configuration new
// handshakes get, replaced by Reload.
type Certificates struct {
	dir        string
	verifyPeer bool
	cur        atomic.Pointer[tls.Config]
}

// Load reads the certificate directory dir into a server configuration; with verifyPeer, clients
// must present a certificate signed by dir's CAFile. Every error names the file and what is
// wrong with it: missing or unreadable, a key that does not match its certificate, a certificate
// outside its validity period, a CA file without certificates, a certificate with a key Go's TLS
// cannot use.
func Load(dir string, verifyPeer bool) (*Certificates, error) {
	c := &Certificates{dir: dir, verifyPeer: verifyPeer}
	if err := c.Reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// Config is the server configuration of the certificates loaded last (its Leaf is set).
func (c *Certificates) Config() *tls.Config { return c.cur.Load() }

// Reload re-reads the directory: new handshakes use the new certificates, connections already up
// keep their sessions. A failed reload keeps the old certificates and returns why.
func (c *Certificates) Reload() error {
	cfg, err := load(c.dir, c.verifyPeer)
	if err != nil {
		return err
	}
	c.cur.Store(cfg)
	return nil
}

func load(dir string, verifyPeer bool) (*tls.Config, error) {
	certPath, keyPath := filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile)
	certPEM, err := readFile(certPath)
	if err != nil {
		return nil, err
	}
	keyPEM, err := readFile(keyPath)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		if why := unusableKeyInPEM(certPEM); why != "" {
			return nil, fmt.Errorf("%s: %s", certPath, why)
		}
		return nil, fmt.Errorf("%s with %s: %v", certPath, keyPath, err)
	}
	if err := checkValidity(certPath, cert.Leaf, time.Now()); err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if verifyPeer {
		caPath := filepath.Join(dir, CAFile)
		caPEM, err := readFile(caPath)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, fmt.Errorf("%s: no PEM certificate in it", caPath)
		}
		if why := unusableKeyInPEM(caPEM); why != "" {
			return nil, fmt.Errorf("%s: %s", caPath, why) // no client of that CA could be verified
		}
		// Not ClientCAs with RequireAndVerifyClientCert: crypto/tls then lists the CAs in the
		// CertificateRequest's certificate_authorities, and GnuTLS clients (libnbd, qemu,
		// nbd-client) with an RSA key answer a TLS 1.3 request that lists CAs with no
		// certificate at all. GnuTLS 3.7 sends a listed CA's certificate only if its key type
		// is among those it derives from signature_algorithms, where it counts rsa_pss_rsae_*
		// as RSA-PSS, not RSA; and TLS 1.3 leaves rsa_pkcs1_* out of that list, as they may
		// only sign certificates (RFC 8446 §4.2.3; crypto/tls puts them in
		// signature_algorithms_cert, which GnuTLS 3.7 ignores). Without certificate_authorities
		// a client with one certificate sends it (GnuTLS does; RFC 8446 §4.3.2 makes the
		// extension optional, RFC 5246 §7.4.4 lets a TLS 1.2 client send any certificate when
		// the list is empty), and verifyClient checks it as crypto/tls would have (issue #40).
		cfg.ClientAuth, cfg.VerifyConnection = tls.RequireAnyClientCert, verifyClient(pool)
	}
	return cfg, nil
}

// oidRSASSAPSS is the public key algorithm of an RSA key restricted to RSA-PSS (RFC 4055 §3.1),
// certtool's --key-type=rsa-pss and openssl's -algorithm RSA-PSS.
var oidRSASSAPSS = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 1, 10}

// unusableKeyInPEM says why crypto/tls cannot use the key of a certificate in pemBytes, or "" if
// it can use them all. crypto/x509 parses such certificates without their key, so the failure
// would otherwise come later and say less: "failed to parse private key" for our own key, "x509:
// cannot verify signature: algorithm unimplemented" for every client of such a CA.
func unusableKeyInPEM(pemBytes []byte) string {
	for rest := pemBytes; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			return ""
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			continue // not ours to judge: X509KeyPair and the pool say what is wrong with it
		}
		switch c.PublicKeyAlgorithm {
		case x509.RSA, x509.ECDSA, x509.Ed25519:
			continue
		}
		var spki struct {
			Algorithm pkix.AlgorithmIdentifier
			Key       asn1.BitString
		}
		if _, err := asn1.Unmarshal(c.RawSubjectPublicKeyInfo, &spki); err == nil && spki.Algorithm.Algorithm.Equal(oidRSASSAPSS) {
			// Go has neither the RSASSA-PSS key type nor the rsa_pss_pss_* signature schemes
			// such a key signs TLS handshakes with (RFC 8446 §4.2.3).
			return fmt.Sprintf("%q has an RSA-PSS key (RSASSA-PSS), which Go's TLS cannot use: make an RSA key "+
				"(certtool's default, openssl genrsa), which TLS 1.3 signs with RSA-PSS anyway, or an ECDSA key", c.Subject)
		}
		return fmt.Sprintf("%q has a %s key, which Go's TLS cannot use: make an RSA, ECDSA or Ed25519 key", c.Subject, c.PublicKeyAlgorithm)
	}
}

// verifyClient returns the check tls.RequireAndVerifyClientCert makes with roots as ClientCAs:
// the client's certificate chains to roots through the intermediates it sent, is valid now and
// allows client authentication (extended key usage). As a VerifyConnection it runs on every
// handshake, resumed sessions included, so a resumed session is checked against the CAs of now.
func verifyClient(roots *x509.CertPool) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 { // RequireAnyClientCert refuses this before us
			return errors.New("tls: client didn't provide a certificate")
		}
		opts := x509.VerifyOptions{
			Roots:         roots,
			Intermediates: x509.NewCertPool(),
			KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		for _, c := range cs.PeerCertificates[1:] {
			opts.Intermediates.AddCert(c)
		}
		if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
			for _, c := range cs.PeerCertificates {
				if c.SignatureAlgorithm == x509.UnknownSignatureAlgorithm && signedWithRSAPSS(c) {
					// Only the cause is in err, deep in "possibly because of": say what to change.
					err = fmt.Errorf("%w; %q has an RSA-PSS signature whose salt is not the hash's length, which Go "+
						"cannot check: sign with openssl's -sigopt rsa_pss_saltlen:digest, or certtool --sign-params RSA-PSS", err, c.Subject)
					break
				}
			}
			return &tls.CertificateVerificationError{UnverifiedCertificates: cs.PeerCertificates, Err: err}
		}
		return nil
	}
}

// signedWithRSAPSS reports whether c's signature is an RSA-PSS one (RFC 4055 §3.1). crypto/x509
// checks only those whose salt is as long as the hash (what RFC 8446 §4.2.3 prescribes for TLS
// signatures and GnuTLS uses); openssl 3.0 signs certificates with the longest salt by default.
func signedWithRSAPSS(c *x509.Certificate) bool {
	var cert struct {
		TBS    asn1.RawValue
		SigAlg pkix.AlgorithmIdentifier
		Sig    asn1.BitString
	}
	_, err := asn1.Unmarshal(c.Raw, &cert)
	return err == nil && cert.SigAlg.Algorithm.Equal(oidRSASSAPSS)
}

func readFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--tls-certificates: %v", err) // *PathError: names the file and why
	}
	return b, nil
}

// checkValidity refuses a certificate that has expired or is not valid yet: clients would refuse
// it on every connection, so the server had better say so at start.
func checkValidity(path string, c *x509.Certificate, now time.Time) error {
	if now.After(c.NotAfter) {
		return fmt.Errorf("%s expired on %s: make a new certificate", path, c.NotAfter.UTC().Format(time.RFC3339))
	}
	if now.Before(c.NotBefore) {
		return fmt.Errorf("%s is not valid before %s (check the clock)", path, c.NotBefore.UTC().Format(time.RFC3339))
	}
	return nil
}
