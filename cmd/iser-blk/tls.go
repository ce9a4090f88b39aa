package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/frontend/nbd"
)

// TLS for `serve`: NBD_OPT_STARTTLS (frontend/nbd tls.go) with x509 certificates read from a
// directory laid out as nbdkit's and libnbd's --tls-certificates (ca-cert.pem, server-cert.pem,
// server-key.pem). Certificates are re-read on SIGHUP; a failed reload keeps the old ones.
//
// No accidental plaintext: NBD itself has no authentication, so a tcp:// listener that other
// hosts can reach needs TLS, or an explicit --tls off (logged as a warning on every start).

// The file names in a --tls-certificates directory (nbdkit-tls(1), libnbd's nbd_set_tls_certificates).
const (
	tlsCAFile   = "ca-cert.pem"
	tlsCertFile = "server-cert.pem"
	tlsKeyFile  = "server-key.pem"
)

type tlsFlags struct {
	mode       string // "", off, on or require ("": not given)
	certDir    string
	verifyPeer bool
}

func (f *tlsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.mode, "tls", "", "TLS for NBD clients (NBD_OPT_STARTTLS): off, on (offered; plaintext clients are served too) or\n"+
		"require (every client must use TLS). Needed on a tcp:// listener other hosts can reach (--tls off to serve plaintext anyway)")
	fs.StringVar(&f.certDir, "tls-certificates", "", "with --tls on|require: the directory of "+tlsCAFile+", "+tlsCertFile+" and "+tlsKeyFile+
		"\n(re-read on SIGHUP)")
	fs.BoolVar(&f.verifyPeer, "tls-verify-peer", false, "with --tls on|require: clients must present a certificate signed by "+tlsCAFile)
}

// serverTLS checks the TLS flags against the listener and loads the certificates. It returns nil
// for a plaintext server. With TLS, certificates are re-read on SIGHUP until ctx ends.
func (f *tlsFlags) serverTLS(ctx context.Context, listenSpec string, log *zap.Logger) (*nbd.TLS, error) {
	switch f.mode {
	case "", "off":
		if f.certDir != "" || f.verifyPeer {
			return nil, usagef("--tls-certificates and --tls-verify-peer need --tls on or --tls require")
		}
		return nil, f.checkPlaintext(listenSpec, log)
	case "on", "require":
	default:
		return nil, usagef("--tls %q: want off, on or require", f.mode)
	}
	if f.certDir == "" {
		return nil, usagef("--tls %s needs --tls-certificates DIR (with %s and %s)", f.mode, tlsCertFile, tlsKeyFile)
	}
	cfg, err := f.load()
	if err != nil {
		return nil, err
	}
	var cur atomic.Pointer[tls.Config]
	cur.Store(cfg)
	// Subscribed before serving: a SIGHUP's default action would end the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go f.reloadOnSIGHUP(ctx, hup, &cur, log)
	log.Info("NBD TLS enabled", zap.String("mode", f.mode), zap.String("certificates", f.certDir),
		zap.Bool("verify_peer", f.verifyPeer), zap.Time("server_cert_expires", cfg.Certificates[0].Leaf.NotAfter))
	return &nbd.TLS{
		Config: &tls.Config{
			MinVersion:         tls.VersionTLS12,
			GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return cur.Load(), nil },
		},
		Require: f.mode == "require",
	}, nil
}

// checkPlaintext refuses a plaintext tcp:// listener that is not on loopback unless --tls off was
// given, and warns about every plaintext tcp:// listener.
func (f *tlsFlags) checkPlaintext(listenSpec string, log *zap.Logger) error {
	u, err := url.Parse(listenSpec)
	if err != nil || u.Scheme != "tcp" {
		return nil // unix sockets (mode 0600) stay as they are; listen reports bad specs
	}
	if !isLoopbackHost(u.Hostname()) {
		if f.mode == "" {
			return usagef("--listen %s is reachable from other hosts, and NBD without TLS lets anyone who can reach it "+
				"read and overwrite the disk: add --tls require --tls-certificates DIR, or --tls off to serve plaintext anyway", listenSpec)
		}
		log.Warn("serving NBD in plaintext on a non-loopback address (--tls off): anyone who can reach the port can read and write the disk",
			zap.String("listen", listenSpec))
		return nil
	}
	log.Warn("NBD over TCP has no authentication or encryption; anyone who can reach the port can read and write the disk",
		zap.String("listen", listenSpec))
	return nil
}

// isLoopbackHost reports whether a listen host only accepts connections from this host: a
// loopback IP or "localhost". An empty host (every address) and other names are not.
func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// uri turns the plaintext NBD URI into the one TLS clients use (nbds://, nbds+unix://).
func (f *tlsFlags) uri(plain string) string {
	if f.mode != "on" && f.mode != "require" {
		return plain
	}
	return strings.Replace(plain, "nbd", "nbds", 1)
}

// load reads the certificate directory into a server configuration. Every error names the file
// and what is wrong with it: missing or unreadable, a key that does not match its certificate,
// a certificate outside its validity period, a CA file without certificates, a certificate with
// a key Go's TLS cannot use.
func (f *tlsFlags) load() (*tls.Config, error) {
	certPath, keyPath := filepath.Join(f.certDir, tlsCertFile), filepath.Join(f.certDir, tlsKeyFile)
	certPEM, err := readTLSFile(certPath)
	if err != nil {
		return nil, err
	}
	keyPEM, err := readTLSFile(keyPath)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		if why := unusableKeyInPEM(certPEM); why != "" {
			return nil, usagef("%s: %s", certPath, why)
		}
		return nil, usagef("%s with %s: %v", certPath, keyPath, err)
	}
	if err := checkValidity(certPath, cert.Leaf, time.Now()); err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if f.verifyPeer {
		caPath := filepath.Join(f.certDir, tlsCAFile)
		caPEM, err := readTLSFile(caPath)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, usagef("%s: no PEM certificate in it", caPath)
		}
		if why := unusableKeyInPEM(caPEM); why != "" {
			return nil, usagef("%s: %s", caPath, why) // no client of that CA could be verified
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

func readTLSFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, usagef("--tls-certificates: %v", err) // *PathError: names the file and why
	}
	return b, nil
}

// checkValidity refuses a certificate that has expired or is not valid yet: clients would refuse
// it on every connection, so the server had better say so at start.
func checkValidity(path string, c *x509.Certificate, now time.Time) error {
	if now.After(c.NotAfter) {
		return usagef("%s expired on %s: make a new certificate", path, c.NotAfter.UTC().Format(time.RFC3339))
	}
	if now.Before(c.NotBefore) {
		return usagef("%s is not valid before %s (check the clock)", path, c.NotBefore.UTC().Format(time.RFC3339))
	}
	return nil
}

// reloadOnSIGHUP reloads the certificates on every signal from hup until ctx ends, then stops
// the signal's delivery.
func (f *tlsFlags) reloadOnSIGHUP(ctx context.Context, hup chan os.Signal, cur *atomic.Pointer[tls.Config], log *zap.Logger) {
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			f.reload(cur, log)
		}
	}
}

// reload re-reads the certificates: new handshakes use the new ones, connections already up keep
// their sessions. A failed reload keeps the old certificates and says why.
func (f *tlsFlags) reload(cur *atomic.Pointer[tls.Config], log *zap.Logger) {
	cfg, err := f.load()
	if err != nil {
		log.Error("TLS certificate reload failed; keeping the old certificates", zap.Error(err))
		return
	}
	cur.Store(cfg)
	leaf := cfg.Certificates[0].Leaf
	log.Info("TLS certificates reloaded", zap.String("subject", leaf.Subject.String()),
		zap.String("serial", fmt.Sprintf("%x", leaf.SerialNumber)), zap.Time("expires", leaf.NotAfter))
}

// serveNBD serves l with the TLS policy t (nil: plaintext).
func serveNBD(srv *nbd.Server, l net.Listener, t *nbd.TLS) error {
	if t == nil {
		return srv.Serve(l)
	}
	return srv.ServeTLS(l, t)
}
