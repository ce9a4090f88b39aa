// Package nbdtls is the TLS policy of the NBD server `iser-blk serve` runs (NBD_OPT_STARTTLS,
// frontend/nbd's tls.go): which listeners may serve plaintext, the x509 certificates read from a
// directory laid out as nbdkit's and libnbd's --tls-certificates (ca-cert.pem, server-cert.pem,
// server-key.pem), client certificate verification for --tls-verify-peer, and their reload on
// SIGHUP.
//
// Invariants:
//   - No accidental plaintext: NBD itself has no authentication, so a tcp:// listener that other
//     hosts can reach needs TLS, or an explicit --tls off (logged as a warning on every start).
//   - Every error Server and Load return is a configuration the operator fixes (the CLI's exit
//     2), and names the file or flag and what is wrong: the package speaks the CLI's flags,
//     which Options mirrors.
//   - A failed reload keeps the certificates in use; new handshakes use the newest good ones,
//     connections already up keep their sessions.
//   - Keys Go's TLS cannot use (RSA-PSS, RFC 4055) are refused when loaded, not at the first
//     handshake.
package nbdtls

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/frontend/nbd"
)

// The file names in a --tls-certificates directory (nbdkit-tls(1), libnbd's nbd_set_tls_certificates).
const (
	CAFile   = "ca-cert.pem"
	CertFile = "server-cert.pem"
	KeyFile  = "server-key.pem"
)

// Options are serve's TLS flags and the listener they apply to.
type Options struct {
	Mode       string      // --tls: "", off, on or require ("": not given)
	CertDir    string      // --tls-certificates: the directory of CAFile, CertFile and KeyFile
	VerifyPeer bool        // --tls-verify-peer: clients must present a certificate signed by CAFile
	Listen     string      // --listen: the listener's spec (unix:///PATH or tcp://HOST:PORT)
	Log        *zap.Logger // nil: no logging
}

// Server checks o against the listener and loads the certificates. It returns nil for a
// plaintext server. With TLS, certificates are re-read on SIGHUP until ctx ends.
func Server(ctx context.Context, o Options) (*nbd.TLS, error) {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	switch o.Mode {
	case "", "off":
		if o.CertDir != "" || o.VerifyPeer {
			return nil, errors.New("--tls-certificates and --tls-verify-peer need --tls on or --tls require")
		}
		return nil, o.checkPlaintext()
	case "on", "require":
	default:
		return nil, fmt.Errorf("--tls %q: want off, on or require", o.Mode)
	}
	if o.CertDir == "" {
		return nil, fmt.Errorf("--tls %s needs --tls-certificates DIR (with %s and %s)", o.Mode, CertFile, KeyFile)
	}
	certs, err := Load(o.CertDir, o.VerifyPeer)
	if err != nil {
		return nil, err
	}
	// Subscribed before serving: a SIGHUP's default action would end the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go certs.reloadOnSIGHUP(ctx, hup, o.Log)
	o.Log.Info("NBD TLS enabled", zap.String("mode", o.Mode), zap.String("certificates", o.CertDir),
		zap.Bool("verify_peer", o.VerifyPeer), zap.Time("server_cert_expires", certs.Config().Certificates[0].Leaf.NotAfter))
	return &nbd.TLS{
		Config: &tls.Config{
			MinVersion:         tls.VersionTLS12,
			GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return certs.Config(), nil },
		},
		Require: o.Mode == "require",
	}, nil
}

// checkPlaintext refuses a plaintext tcp:// listener that is not on loopback unless --tls off was
// given, and warns about every plaintext tcp:// listener.
func (o Options) checkPlaintext() error {
	u, err := url.Parse(o.Listen)
	if err != nil || u.Scheme != "tcp" {
		return nil // unix sockets (mode 0600) stay as they are; the listener reports bad specs
	}
	if !isLoopbackHost(u.Hostname()) {
		if o.Mode == "" {
			return fmt.Errorf("--listen %s is reachable from other hosts, and NBD without TLS lets anyone who can reach it "+
				"read and overwrite the disk: add --tls require --tls-certificates DIR, or --tls off to serve plaintext anyway", o.Listen)
		}
		o.Log.Warn("serving NBD in plaintext on a non-loopback address (--tls off): anyone who can reach the port can read and write the disk",
			zap.String("listen", o.Listen))
		return nil
	}
	o.Log.Warn("NBD over TCP has no authentication or encryption; anyone who can reach the port can read and write the disk",
		zap.String("listen", o.Listen))
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

// URI turns the plaintext NBD URI into the one TLS clients use (nbds://, nbds+unix://).
func (o Options) URI(plain string) string {
	if o.Mode != "on" && o.Mode != "require" {
		return plain
	}
	return strings.Replace(plain, "nbd", "nbds", 1)
}

// reloadOnSIGHUP reloads the certificates on every signal from hup until ctx ends, then stops
// the signal's delivery. A failed reload keeps the old certificates and says why.
func (c *Certificates) reloadOnSIGHUP(ctx context.Context, hup chan os.Signal, log *zap.Logger) {
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if err := c.Reload(); err != nil {
				log.Error("TLS certificate reload failed; keeping the old certificates", zap.Error(err))
				continue
			}
			leaf := c.Config().Certificates[0].Leaf
			log.Info("TLS certificates reloaded", zap.String("subject", leaf.Subject.String()),
				zap.String("serial", fmt.Sprintf("%x", leaf.SerialNumber)), zap.Time("expires", leaf.NotAfter))
		}
	}
}
