package nbd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/testcerts"
)

// tlsKit is a CA with a server certificate, and a client certificate from the same CA.
type tlsKit struct {
	ca     *testcerts.CA
	server tls.Certificate
	client tls.Certificate
}

func newTLSKit(t testing.TB, name string) *tlsKit {
	t.Helper()
	ca, err := testcerts.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := ca.Server("server", time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	cp, err := ca.Client("client")
	if err != nil {
		t.Fatal(err)
	}
	k := &tlsKit{ca: ca}
	if k.server, err = sp.TLS(); err != nil {
		t.Fatal(err)
	}
	if k.client, err = cp.TLS(); err != nil {
		t.Fatal(err)
	}
	return k
}

// serverConfig is the server side; verifyPeer requires client certificates from the kit's CA.
func (k *tlsKit) serverConfig(verifyPeer bool) *tls.Config {
	cfg := &tls.Config{Certificates: []tls.Certificate{k.server}}
	if verifyPeer {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = k.ca.Pool()
	}
	return cfg
}

// clientConfig trusts the kit's CA and presents cert (nil: no client certificate).
func (k *tlsKit) clientConfig(cert *tls.Certificate) *tls.Config {
	cfg := &tls.Config{RootCAs: k.ca.Pool(), ServerName: "localhost", MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return cfg
}

// tlsFixture serves a device with ServeTLS on 127.0.0.1 and records the server's log.
type tlsFixture struct {
	t    *testing.T
	srv  *Server
	addr string
	logs *observer.ObservedLogs
}

func startTLSServer(t *testing.T, dev block.Device, opts Options, policy *TLS) *tlsFixture {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	opts.Logger = zap.New(core)
	srv, err := NewServer(dev, opts)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(l, policy) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-errc; !errors.Is(err, errServerClosed) {
			t.Errorf("ServeTLS returned %v", err)
		}
	})
	return &tlsFixture{t: t, srv: srv, addr: l.Addr().String(), logs: logs}
}

func (f *tlsFixture) dial() *testClient {
	f.t.Helper()
	nc, err := net.Dial("tcp", f.addr)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	return newTestClient(f.t, nc)
}

// startTLS sends NBD_OPT_STARTTLS, expects the ACK and runs the client side of the handshake.
func (c *testClient) startTLS(cfg *tls.Config) error {
	if err := c.sendOpt(optStartTLS, nil); err != nil {
		return err
	}
	r, err := c.readOptReply()
	if err != nil {
		return err
	}
	if r.opt != optStartTLS || r.typ != repAck {
		return errors.New("STARTTLS not acknowledged: " + string(r.data))
	}
	tc := tls.Client(c.nc, cfg)
	if err := tc.Handshake(); err != nil {
		return err
	}
	c.nc, c.br = tc, bufio.NewReaderSize(tc, 1<<16)
	return nil
}

// tlsConnect greets, upgrades to TLS and enters transmission, failing the test on any error.
func (c *testClient) tlsConnect(cfg *tls.Config, structured bool) *testClient {
	c.t.Helper()
	if err := c.greet(cflagFixedNewstyle | cflagNoZeroes); err != nil {
		c.t.Fatalf("greet: %v", err)
	}
	if err := c.startTLS(cfg); err != nil {
		c.t.Fatalf("STARTTLS: %v", err)
	}
	return c.goExport(structured)
}

// expectOpt sends opt and checks the type of its (first) reply.
func (c *testClient) expectOpt(opt uint32, data []byte, typ uint32) optReplyT {
	c.t.Helper()
	if err := c.sendOpt(opt, data); err != nil {
		c.t.Fatal(err)
	}
	r, err := c.readOptReply()
	if err != nil {
		c.t.Fatalf("option %d: %v", opt, err)
	}
	if r.opt != opt || r.typ != typ {
		c.t.Fatalf("option %d: reply %d type %#x (%q), want %#x", opt, r.opt, r.typ, r.data, typ)
	}
	return r
}

// expectClosed checks that the server ends the connection.
func (c *testClient) expectClosed() {
	c.t.Helper()
	if _, err := c.br.ReadByte(); err == nil {
		c.t.Fatal("the server kept the connection open")
	}
}

// roundTrip writes random data and reads it back through c.
func roundTrip(t *testing.T, c *testClient, off uint64, n uint32) {
	t.Helper()
	data := make([]byte, n)
	rand.Read(data)
	if r := c.do(cmdWrite, 0, off, n, data); r.errno != 0 {
		t.Fatalf("write: errno %d", r.errno)
	}
	if r := c.do(cmdRead, 0, off, n, nil); r.errno != 0 || !bytes.Equal(r.data, data) {
		t.Fatalf("read back: errno %d, equal %v", r.errno, bytes.Equal(r.data, data))
	}
}

// TestStartTLSRequired: under Require (FORCEDTLS) every option but STARTTLS and ABORT is answered
// NBD_REP_ERR_TLS_REQD and EXPORT_NAME ends the session; after STARTTLS the same options work
// inside TLS, a second STARTTLS is NBD_REP_ERR_INVALID, and data moves byte-exact.
func TestStartTLSRequired(t *testing.T) {
	k := newTLSKit(t, "ca")
	f := startTLSServer(t, newMem(t, 8<<20, ""), Options{}, &TLS{Config: k.serverConfig(false), Require: true})

	c := f.dial()
	if err := c.greet(cflagFixedNewstyle | cflagNoZeroes); err != nil {
		t.Fatal(err)
	}
	for _, o := range []struct {
		opt  uint32
		data []byte
	}{{optList, nil}, {optInfo, goData("")}, {optGo, goData("")}, {optStructuredReply, nil}, {99, []byte("x")}} {
		c.expectOpt(o.opt, o.data, repErrTLSReqd)
	}
	c.expectOpt(optStartTLS, []byte("junk"), repErrInvalid)
	if err := c.startTLS(k.clientConfig(nil)); err != nil {
		t.Fatal(err)
	}
	c.expectOpt(optStartTLS, nil, repErrInvalid)
	c.expectOpt(optList, nil, repServer)
	if r, err := c.readOptReply(); err != nil || r.typ != repAck {
		t.Fatalf("LIST end: %+v %v", r, err)
	}
	c.goExport(true)
	roundTrip(t, c, 4096, 256<<10)
	roundTrip(t, c, 1<<20, 4096)

	plain := f.dial()
	if err := plain.greet(cflagFixedNewstyle); err != nil {
		t.Fatal(err)
	}
	if err := plain.sendOpt(optExportName, nil); err != nil {
		t.Fatal(err)
	}
	plain.expectClosed()

	old := f.dial()
	if err := old.greet(cflagNoZeroes); err != nil { // not fixed newstyle: can never have TLS
		t.Fatal(err)
	}
	old.expectClosed()
	roundTrip(t, c, 0, 512) // the TLS client was not disturbed
}

// TestStartTLSOffered: with TLS on but not required, plaintext and TLS clients are both served;
// a client that is not fixed newstyle is refused STARTTLS with NBD_REP_ERR_POLICY.
func TestStartTLSOffered(t *testing.T) {
	k := newTLSKit(t, "ca")
	f := startTLSServer(t, newMem(t, 8<<20, ""), Options{}, &TLS{Config: k.serverConfig(false)})
	roundTrip(t, f.dial().connect(false), 0, 64<<10)
	roundTrip(t, f.dial().tlsConnect(k.clientConfig(nil), false), 64<<10, 64<<10)
	c := f.dial()
	if err := c.greet(cflagNoZeroes); err != nil {
		t.Fatal(err)
	}
	c.expectOpt(optStartTLS, nil, repErrPolicy)
	roundTrip(t, c.goExport(false), 128<<10, 4096)
}

// TestStartTLSRefusedClients: a client that trusts another CA, and under client verification a
// client without a certificate or with one from another CA, fail the handshake; the failure is
// logged with the peer's address, and a good client connected before keeps working.
func TestStartTLSRefusedClients(t *testing.T) {
	k, other := newTLSKit(t, "ca"), newTLSKit(t, "other-ca")
	f := startTLSServer(t, newMem(t, 8<<20, ""), Options{}, &TLS{Config: k.serverConfig(true), Require: true})
	good := f.dial().tlsConnect(k.clientConfig(&k.client), true)
	roundTrip(t, good, 0, 4096)

	bad := []struct {
		name string
		cfg  *tls.Config
	}{
		{"trusts another CA", other.clientConfig(&k.client)},
		{"no client certificate", k.clientConfig(nil)},
		{"client certificate from another CA", k.clientConfig(&other.client)},
	}
	for i, b := range bad {
		c := f.dial()
		if err := c.greet(cflagFixedNewstyle | cflagNoZeroes); err != nil {
			t.Fatal(err)
		}
		local := c.nc.LocalAddr().String()
		err := c.startTLS(b.cfg)
		if err == nil {
			// TLS 1.3: the client learns of a refused certificate on its first read.
			err = c.sendOpt(optList, nil)
			if err == nil {
				_, err = c.readOptReply()
			}
		}
		if err == nil {
			t.Fatalf("%s: the connection was accepted", b.name)
		}
		waitFor(t, func() bool { return len(f.logs.FilterMessage("nbd TLS handshake failed").All()) > i })
		entry := f.logs.FilterMessage("nbd TLS handshake failed").All()[i]
		if remote := entry.ContextMap()["remote"]; !strings.Contains(remote.(string), local) {
			t.Errorf("%s: handshake failure logged for %v, want the peer %s", b.name, remote, local)
		}
		roundTrip(t, good, uint64(i+1)<<20, 64<<10)
	}
}

// waitFor polls cond (the server logs asynchronously from the client's view) for up to 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStartTLSRejectsPipelinedBytes: bytes sent after STARTTLS without waiting for the ACK
// crossed the network in the clear; the server ends the session rather than use them.
func TestStartTLSRejectsPipelinedBytes(t *testing.T) {
	k := newTLSKit(t, "ca")
	f := startTLSServer(t, newMem(t, 1<<20, ""), Options{}, &TLS{Config: k.serverConfig(false), Require: true})
	c := f.dial()
	if err := c.greet(cflagFixedNewstyle | cflagNoZeroes); err != nil {
		t.Fatal(err)
	}
	if _, err := c.nc.Write(cat(optBytes(optStartTLS, nil), optBytes(optGo, goData("")))); err != nil {
		t.Fatal(err)
	}
	c.expectClosed()
}

// TestSpliceOffUnderTLS: with --splice asked for and a device that can fill pipes, a TLS
// connection never splices (the payload must go through the tls.Conn) and reads and writes are
// byte-exact; a plaintext connection on the same server still splices.
func TestSpliceOffUnderTLS(t *testing.T) {
	k := newTLSKit(t, "ca")
	mem := newMem(t, 16<<20, "")
	pd := &pipeDevice{submitDevice: &submitDevice{Device: mem, declineFrom: 1 << 62, failFrom: 1 << 62}}
	f := startTLSServer(t, pd, Options{Splice: true, MaxInflight: 8}, &TLS{Config: k.serverConfig(false)})
	for _, structured := range []bool{false, true} {
		c := f.dial().tlsConnect(k.clientConfig(nil), structured)
		for i := range 8 {
			roundTrip(t, c, uint64(i)<<20, 1<<20)
			roundTrip(t, c, uint64(i)<<20+4096, 64<<10)
		}
	}
	if n := pd.piped.Load(); n != 0 {
		t.Fatalf("%d reads went through a pipe on TLS connections", n)
	}
	roundTrip(t, f.dial().connect(true), 8<<20, 1<<20)
	if pd.piped.Load() == 0 {
		t.Fatal("the plaintext connection did not splice: the test does not exercise the splice path")
	}
}

// TestServeTLSRaisesMinVersion: a client limited to TLS 1.1 is refused (proto.md "TLS versions"),
// also when the certificates come from GetConfigForClient (as serve's reloadable ones do).
func TestServeTLSRaisesMinVersion(t *testing.T) {
	k := newTLSKit(t, "ca")
	lax := func() *tls.Config { // what a careless caller might pass
		cfg := k.serverConfig(false)
		cfg.MinVersion = tls.VersionTLS10
		return cfg
	}
	dynamic := &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return lax(), nil }}
	for name, cfg := range map[string]*tls.Config{"static": lax(), "GetConfigForClient": dynamic} {
		f := startTLSServer(t, newMem(t, 1<<20, ""), Options{}, &TLS{Config: cfg, Require: true})
		old := k.clientConfig(nil)
		old.MinVersion, old.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
		c := f.dial()
		if err := c.greet(cflagFixedNewstyle); err != nil {
			t.Fatal(err)
		}
		if err := c.startTLS(old); err == nil {
			t.Errorf("%s: a TLS 1.1 handshake succeeded", name)
		}
		roundTrip(t, f.dial().tlsConnect(k.clientConfig(nil), false), 0, 4096)
	}
}

// TestStartTLSForgetsPlaintextOptions: structured replies negotiated in the clear do not survive
// STARTTLS (a man in the middle could inject the option; nbdkit's CVE-2021-3716). A client that
// does not ask again inside TLS gets simple replies; the test client reads them as such and
// fails on a structured one.
func TestStartTLSForgetsPlaintextOptions(t *testing.T) {
	k := newTLSKit(t, "ca")
	f := startTLSServer(t, newMem(t, 8<<20, ""), Options{}, &TLS{Config: k.serverConfig(false)})
	c := f.dial()
	if err := c.greet(cflagFixedNewstyle | cflagNoZeroes); err != nil {
		t.Fatal(err)
	}
	c.expectOpt(optStructuredReply, nil, repAck)
	if err := c.startTLS(k.clientConfig(nil)); err != nil {
		t.Fatalf("STARTTLS: %v", err)
	}
	c.goExport(false)
	if r := c.do(cmdRead, 0, 0, 4096, nil); r.errno != 0 || r.structured {
		t.Fatalf("READ inside TLS: errno %d, structured reply %v: the plaintext STRUCTURED_REPLY survived STARTTLS", r.errno, r.structured)
	}
}
