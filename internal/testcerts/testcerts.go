// Package testcerts makes X.509 certificate authorities and certificates for tests of the TLS
// paths (NBD_OPT_STARTTLS): a CA, server and client certificates it signs, and the PEM files
// nbdkit, libnbd and iser-blk read from a --tls-certificates directory (ca-cert.pem,
// server-cert.pem, server-key.pem, client-cert.pem, client-key.pem).
//
// Keys are ECDSA P-256 unless a test asks for another Key (the *Key functions): P-256 is quick
// to make and accepted by Go's crypto/tls and GnuTLS alike, while RSA keys are what certtool and
// openssl hand out by default and what GnuTLS clients choose differently (issue #40).
// Nothing here is for production use: validity windows are whatever the test asks for.
package testcerts

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	PEM  []byte
}

// Pair is a certificate and its key, PEM encoded.
type Pair struct {
	CertPEM, KeyPEM []byte
	Cert            *x509.Certificate
}

// TLS returns the pair as a tls.Certificate.
func (p Pair) TLS() (tls.Certificate, error) { return tls.X509KeyPair(p.CertPEM, p.KeyPEM) }

// Key is a key algorithm and size for NewCAKey, ServerKey and ClientKey.
type Key string

const (
	P256    Key = "ecdsa-p256"
	P384    Key = "ecdsa-p384"
	RSA2048 Key = "rsa-2048"
	RSA3072 Key = "rsa-3072"
	RSA4096 Key = "rsa-4096"
)

// generate makes a key of type k.
func (k Key) generate() (crypto.Signer, error) {
	switch k {
	case P256:
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case P384:
		return ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case RSA2048:
		return rsa.GenerateKey(rand.Reader, 2048)
	case RSA3072:
		return rsa.GenerateKey(rand.Reader, 3072)
	case RSA4096:
		return rsa.GenerateKey(rand.Reader, 4096)
	}
	return nil, fmt.Errorf("testcerts: unknown key type %q", k)
}

// NewCA makes a self-signed CA named name with a P-256 key, valid from an hour ago for a day.
func NewCA(name string) (*CA, error) { return NewCAKey(name, P256) }

// NewCAKey is NewCA with a key of type k.
func NewCAKey(name string, k Key) (*CA, error) {
	key, err := k.generate()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"iser-blk test"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Pool returns a pool that trusts only ca.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Server issues a server certificate with a P-256 key for localhost, 127.0.0.1 and ::1, valid
// from notBefore to notAfter (zero: from an hour ago for a day).
func (ca *CA) Server(cn string, notBefore, notAfter time.Time) (Pair, error) {
	return ca.ServerKey(cn, P256, notBefore, notAfter)
}

// ServerKey is Server with a key of type k.
func (ca *CA) ServerKey(cn string, k Key, notBefore, notAfter time.Time) (Pair, error) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	return ca.Issue(tmpl, k, notBefore, notAfter)
}

// Client issues a client certificate with a P-256 key.
func (ca *CA) Client(cn string) (Pair, error) { return ca.ClientKey(cn, P256) }

// ClientKey is Client with a key of type k.
func (ca *CA) ClientKey(cn string, k Key) (Pair, error) {
	return ca.Issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, k, time.Time{}, time.Time{})
}

// Issue signs a certificate made from tmpl for a new key of type k, valid from notBefore to
// notAfter (zero: from an hour ago for a day); it sets the serial number and adds the key usages
// a TLS key needs to tmpl's. It is for the certificates Server and Client do not make: wrong
// extended key usages, expired ones, intermediate CAs (with x509.KeyUsageCertSign).
func (ca *CA) Issue(tmpl *x509.Certificate, k Key, notBefore, notAfter time.Time) (Pair, error) {
	if notBefore.IsZero() {
		notBefore = time.Now().Add(-time.Hour)
	}
	if notAfter.IsZero() {
		notAfter = time.Now().Add(24 * time.Hour)
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore, tmpl.NotAfter = notBefore, notAfter
	tmpl.KeyUsage |= x509.KeyUsageDigitalSignature
	key, err := k.generate()
	if err != nil {
		return Pair{}, err
	}
	if _, isRSA := key.(*rsa.PrivateKey); isRSA {
		// As certtool's encryption_key and openssl's defaults: TLS 1.2's RSA key exchange
		// encrypts to the key. Signing is what TLS 1.3 and ECDHE use it for.
		tmpl.KeyUsage |= x509.KeyUsageKeyEncipherment
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return Pair{}, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return Pair{}, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	return Pair{
		Cert:    cert,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
	}, nil
}

// WriteDir writes a --tls-certificates directory: ca-cert.pem, and prefix-cert.pem and
// prefix-key.pem for the pair (prefix "server" or "client"). Keys are written 0600.
func WriteDir(dir string, ca *CA, prefix string, p Pair) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ca-cert.pem"), ca.PEM, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, prefix+"-cert.pem"), p.CertPEM, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, prefix+"-key.pem"), p.KeyPEM, 0o600)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}
