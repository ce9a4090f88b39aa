package nbd

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"net"

	"github.com/iser-blk/iser-blk/internal/rawio"
)

// TLS on a listener: NBD_OPT_STARTTLS (proto.md "TLS support"). The client upgrades the
// connection in the middle of option haggling; from the server's NBD_REP_ACK on, every byte in
// both directions goes through a tls.Conn, and no byte the client sent in the clear before that
// ACK is taken into the TLS session.
//
// With TLS, the connection has no raw socket to bypass: rawio passes its calls through to the
// tls.Conn (which offers no file descriptor), so neither raw reads and writevs nor spliced READ
// replies (splice.go, which needs rawio.Conn.Raw) ever touch the socket under TLS. Replies are
// gathered in a bufio.Writer instead of a writev so that a batch goes out in few TLS records.

// TLS is a listener's TLS policy (ServeTLS).
type TLS struct {
	// Config is the server side of the TLS session: certificates (typically through
	// GetConfigForClient, so they can be replaced while serving) and client authentication.
	// A MinVersion below TLS 1.2 is raised to 1.2 (proto.md "TLS versions").
	Config *tls.Config
	// Require answers every option but NBD_OPT_STARTTLS and NBD_OPT_ABORT with
	// NBD_REP_ERR_TLS_REQD until TLS is up (the spec's FORCEDTLS mode, nbdkit's --tls=require).
	// Otherwise TLS is offered and plaintext clients are served too (--tls=on).
	Require bool
}

// tlsWriteBuffer gathers a batch of replies for the TLS writer: with records of at most 16 KiB
// the batch goes out in full records, and larger payloads are written straight from their buffers.
const tlsWriteBuffer = 64 << 10

// ServeTLS is Serve with NBD_OPT_STARTTLS offered (or required) on every connection of l.
func (s *Server) ServeTLS(l net.Listener, t *TLS) error {
	if t == nil || t.Config == nil {
		return errors.New("nbd: ServeTLS needs a TLS configuration")
	}
	return s.serve(l, &TLS{Config: atLeastTLS12(t.Config), Require: t.Require})
}

// atLeastTLS12 returns a copy of cfg that negotiates TLS 1.2 or later, also through the
// configurations its GetConfigForClient returns.
func atLeastTLS12(cfg *tls.Config) *tls.Config {
	cfg = cfg.Clone()
	cfg.MinVersion = max(cfg.MinVersion, tls.VersionTLS12)
	if get := cfg.GetConfigForClient; get != nil {
		cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			c, err := get(hello)
			if c != nil && c.MinVersion < tls.VersionTLS12 {
				c = c.Clone()
				c.MinVersion = tls.VersionTLS12
			}
			return c, err
		}
	}
	return cfg
}

// tlsHandshakeError is a TLS handshake that failed after our NBD_REP_ACK: the session ends
// ("it is too late to continue without TLS") and the failure is logged with the peer's address.
type tlsHandshakeError struct{ err error }

func (e *tlsHandshakeError) Error() string { return "nbd: TLS handshake: " + e.err.Error() }
func (e *tlsHandshakeError) Unwrap() error { return e.err }

// tlsHandshake runs the server side of the TLS handshake on nc. The connection's handshake
// deadline bounds it.
func tlsHandshake(nc net.Conn, cfg *tls.Config) (net.Conn, error) {
	tc := tls.Server(nc, cfg)
	if err := tc.HandshakeContext(context.Background()); err != nil {
		return nil, err
	}
	return tc, nil
}

// tlsRequired reports whether options other than STARTTLS and ABORT must be refused.
func (n *negotiation) tlsRequired() bool {
	return n.c.tls != nil && n.c.tls.Require && !n.tlsDone
}

// startTLS answers NBD_OPT_STARTTLS and, after the ACK, upgrades the connection: NOTLS mode
// (no policy on this listener) answers NBD_REP_ERR_POLICY, a second STARTTLS NBD_REP_ERR_INVALID.
func (n *negotiation) startTLS(data []byte) error {
	c := n.c
	switch {
	case c.tls == nil:
		return n.reply(optStartTLS, repErrPolicy, []byte("TLS is not enabled on this listener"))
	case !n.fixed:
		// "The server MUST operate in NOTLS mode unless ... NBD_FLAG_C_FIXED_NEWSTYLE"
		return n.reply(optStartTLS, repErrPolicy, []byte("TLS needs fixed newstyle negotiation"))
	case n.tlsDone:
		return n.reply(optStartTLS, repErrInvalid, []byte("TLS is already in use"))
	case len(data) != 0:
		return n.reply(optStartTLS, repErrInvalid, []byte("NBD_OPT_STARTTLS takes no data"))
	}
	if n.br.Buffered() != 0 {
		// The client sent more without waiting for our reply. Those bytes crossed the network
		// in the clear; taking them as TLS records or, worse, as options after the upgrade
		// is the STARTTLS command injection of CVE-2011-0411. A client MUST wait for the ACK.
		return errors.New("nbd: client sent data after NBD_OPT_STARTTLS before the server's reply")
	}
	if err := n.reply(optStartTLS, repAck, nil); err != nil {
		return err
	}
	tc, err := c.s.tlsHandshake(c.nc, c.tls.Config)
	if err != nil {
		return &tlsHandshakeError{err}
	}
	c.useTLS(tc)
	n.br = c.br
	n.bw.Reset(tc)
	n.tlsDone = true
	// Nothing negotiated in the clear survives the upgrade (proto.md: the client must not rely on
	// it; nbdkit's CVE-2021-3716): a man in the middle could otherwise inject
	// NBD_OPT_STRUCTURED_REPLY before STARTTLS and change what the TLS session speaks.
	n.structured = false
	return nil
}

// useTLS makes tc the connection's stream: reads and writes go through it from now on.
func (c *conn) useTLS(tc net.Conn) {
	c.stream = tc
	c.raw = rawio.New(tc)
	c.br.Reset(c.raw)
	c.tlsw = bufio.NewWriterSize(tc, tlsWriteBuffer)
}

// writeTLS is writeIov on a TLS connection: one bufio.Writer pass instead of a writev, so a
// batch of small replies becomes one record rather than one record (and one write) per buffer.
func (c *conn) writeTLS(iov [][]byte) error {
	for _, b := range iov {
		if _, err := c.tlsw.Write(b); err != nil {
			return err
		}
	}
	return c.tlsw.Flush()
}

// closeStream ends the connection; a TLS session is shut down first (close_notify), as
// NBD_CMD_DISC asks ("shut down the TLS session (if one is running), and close the TCP session").
func (c *conn) closeStream() {
	if c.stream != c.nc {
		_ = c.stream.Close() // closes nc too
		return
	}
	c.nc.Close()
}
