//go:build e2e

// Package tls_test is the host end-to-end test of `iser-blk serve --tls`: the real binary in
// front of a private tgtd LUN on a TCP listener, with real TLS clients (libnbd's nbdinfo and
// nbdcopy over nbds://, qemu-img with a tls-creds-x509 object, fio's nbd engine), clients that
// must be refused, certificate rotation with SIGHUP, and the refusal to serve plaintext to the
// network. Certificates are made by the test (internal/testcerts); the key-type matrix
// (matrix_e2e_test.go) has them made by certtool and openssl, as users make them.
package tls_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/internal/testcerts"
	"github.com/iser-blk/iser-blk/test/e2e/gateway"
	"github.com/iser-blk/iser-blk/test/e2e/netns"
	"github.com/iser-blk/iser-blk/test/e2e/tgtd"
)

const exportSize = 200 << 20

// pki is the test's certificates: the server's directory, a good client's, and clients that must
// be refused.
type pki struct {
	ca, other    *testcerts.CA
	serverDir    string // ca-cert.pem, server-cert.pem, server-key.pem
	clientDir    string // our CA, a client certificate from it
	otherCADir   string // trusts another CA (with that CA's client certificate)
	noCertDir    string // our CA, no client certificate
	wrongCertDir string // our CA, a client certificate from another CA
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{ca: newCA(t, "iser-blk e2e CA"), other: newCA(t, "another CA")}
	root := t.TempDir()
	p.serverDir = filepath.Join(root, "server")
	p.clientDir, p.otherCADir = filepath.Join(root, "client"), filepath.Join(root, "other-ca")
	p.noCertDir, p.wrongCertDir = filepath.Join(root, "no-cert"), filepath.Join(root, "wrong-cert")
	p.rotate(t)
	writeDir(t, p.clientDir, p.ca, "client", client(t, p.ca))
	writeDir(t, p.otherCADir, p.other, "client", client(t, p.other))
	writeDir(t, p.wrongCertDir, p.ca, "client", client(t, p.other))
	if err := os.MkdirAll(p.noCertDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.noCertDir, "ca-cert.pem"), p.ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// rotate writes a new server certificate into the server's directory and returns it.
func (p *pki) rotate(t *testing.T) *x509.Certificate {
	t.Helper()
	sp, err := p.ca.Server("iser-blk e2e server", time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	writeDir(t, p.serverDir, p.ca, "server", sp)
	return sp.Cert
}

func newCA(t *testing.T, name string) *testcerts.CA {
	t.Helper()
	ca, err := testcerts.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func client(t *testing.T, ca *testcerts.CA) testcerts.Pair {
	t.Helper()
	p, err := ca.Client("iser-blk e2e client")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func writeDir(t *testing.T, dir string, ca *testcerts.CA, prefix string, p testcerts.Pair) {
	t.Helper()
	if err := testcerts.WriteDir(dir, ca, prefix, p); err != nil {
		t.Fatal(err)
	}
}

// tlsURI is the server's nbds:// URI with a client certificate directory for libnbd.
func tlsURI(t *testing.T, s *gateway.Server, dir string) string {
	t.Helper()
	if !strings.HasPrefix(s.URI, "nbds://") {
		t.Fatalf("serve printed %q, want an nbds:// URI", s.URI)
	}
	return s.URI + "?tls-certificates=" + url.QueryEscape(dir)
}

func hostPort(t *testing.T, s *gateway.Server) (host, port string) {
	t.Helper()
	u, err := url.Parse(s.URI)
	if err != nil {
		t.Fatal(err)
	}
	return u.Hostname(), u.Port()
}

func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	out, err := command(name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func command(name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return exec.CommandContext(ctx, name, args...).CombinedOutput()
}

func startTgtd(t *testing.T) string {
	tg := tgtd.Start(t, tgtd.Options{Size: exportSize})
	return fmt.Sprintf("iscsi://%s/%s/%d", tg.Portal, tg.Name, tg.LUN)
}

// TestServeTLSWithClients: under --tls require --tls-verify-peer, libnbd, qemu-img and fio move
// data byte-exact over TLS; plaintext clients, clients trusting another CA and clients without an
// acceptable certificate are refused while a good client keeps working; a certificate rotated
// with SIGHUP is the one new clients see, and a failed rotation keeps it.
func TestServeTLSWithClients(t *testing.T) {
	p := newPKI(t)
	srv := gateway.StartListen(t, startTgtd(t), "tcp://127.0.0.1:0",
		"--tls", "require", "--tls-certificates", p.serverDir, "--tls-verify-peer")
	uri := tlsURI(t, srv, p.clientDir)

	checkNBDInfo(t, uri)
	in := copyIn(t, uri)
	checkCopyOut(t, uri, in)
	checkQemuImg(t, srv, p.clientDir, in)

	// A good client (fio, verifying what it writes) runs while the bad ones are refused.
	fioDone := startFio(t, srv.URI, p.clientDir, 20*time.Second)
	checkRefusals(t, srv, p)
	if err := <-fioDone; err != nil {
		t.Fatalf("the good client failed while others were refused: %v", err)
	}
	checkRotation(t, srv, p)
	srv.Stop(t)
}

// checkNBDInfo: nbdinfo connects over TLS and sees the export's size.
func checkNBDInfo(t *testing.T, uri string) {
	out := strings.TrimSpace(string(run(t, "nbdinfo", "--size", uri)))
	if out != fmt.Sprint(exportSize) {
		t.Fatalf("nbdinfo --size: %q, want %d", out, exportSize)
	}
}

// copyIn writes 200 MiB of random data to the export with nbdcopy and returns the file.
func copyIn(t *testing.T, uri string) string {
	in := filepath.Join(t.TempDir(), "in.img")
	data := make([]byte, exportSize)
	rand.Read(data)
	if err := os.WriteFile(in, data, 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "nbdcopy", "--flush", in, uri)
	return in
}

// checkCopyOut reads the export back with nbdcopy and compares it with in.
func checkCopyOut(t *testing.T, uri, in string) {
	out := filepath.Join(t.TempDir(), "out.img")
	run(t, "nbdcopy", uri, out)
	sameFiles(t, in, out)
}

// checkQemuImg reads the export with qemu's NBD client and a tls-creds-x509 object.
func checkQemuImg(t *testing.T, srv *gateway.Server, clientDir, in string) {
	host, port := hostPort(t, srv)
	out := filepath.Join(t.TempDir(), "qemu.img")
	run(t, "qemu-img", "convert", "--object", "tls-creds-x509,id=tls0,dir="+clientDir+",endpoint=client",
		"--image-opts", fmt.Sprintf("driver=nbd,host=%s,port=%s,tls-creds=tls0", host, port), "-O", "raw", out)
	sameFiles(t, in, out)
}

func sameFiles(t *testing.T, a, b string) {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(x, y) {
		t.Fatalf("%s (%d bytes) and %s (%d bytes) differ", a, len(x), b, len(y))
	}
}

// startFio runs fio's nbd engine over uri for d: 4 KiB random writes, each read back and checked
// (crc32c) as it goes. fio's engine connects with nbd_connect_uri without allowing local files,
// so libnbd refuses ?tls-certificates= there and reads its default directory instead: for root
// the system-wide /etc/pki/libnbd, for anyone else $HOME/.pki/libnbd. So fio runs as nobody with
// a private HOME holding the client's certificates.
func startFio(t *testing.T, uri, clientDir string, d time.Duration) <-chan error {
	home := nobodyHome(t, clientDir)
	done := make(chan error, 1)
	go func() {
		cmd := exec.Command("fio", "--name=tls", "--ioengine=nbd", "--uri="+uri, "--rw=randwrite", "--bs=4k",
			"--iodepth=16", "--size=32M", "--time_based", fmt.Sprintf("--runtime=%ds", int(d.Seconds())),
			"--verify=crc32c", "--verify_fatal=1", "--verify_backlog=256")
		cmd.Env = append(os.Environ(), "HOME="+home)
		cmd.Dir = home
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		out, err := cmd.CombinedOutput()
		if err == nil && !strings.Contains(string(out), "err= 0") {
			err = errors.New("no err= 0 in fio's output")
		}
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, out)
		}
		done <- err
	}()
	return done
}

const nobody = 65534

// nobodyHome makes a home directory owned by nobody with the client certificates in .pki/libnbd.
func nobodyHome(t *testing.T, clientDir string) string {
	t.Helper()
	home, err := os.MkdirTemp("", "iser-blk-tls-home-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	pki := filepath.Join(home, ".pki", "libnbd")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ca-cert.pem", "client-cert.pem", "client-key.pem"} {
		b, err := os.ReadFile(filepath.Join(clientDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(pki, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{home, filepath.Join(home, ".pki"), pki, filepath.Join(pki, "ca-cert.pem"),
		filepath.Join(pki, "client-cert.pem"), filepath.Join(pki, "client-key.pem")} {
		if err := os.Chown(p, nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	return home
}

// checkRefusals: every client that must not get in is refused, with NBD_REP_ERR_TLS_REQD for a
// plaintext one, and the server logs each failed handshake with the peer's address.
func checkRefusals(t *testing.T, srv *gateway.Server, p *pki) {
	host, port := hostPort(t, srv)
	addr := net.JoinHostPort(host, port)
	if typ := plainOption(t, addr); typ != repErrTLSReqd {
		t.Errorf("plaintext NBD_OPT_LIST answered %#x, want NBD_REP_ERR_TLS_REQD", typ)
	}
	if out, err := command("nbdinfo", "nbd://"+addr+"/"); err == nil {
		t.Errorf("nbdinfo without TLS got in: %s", out)
	}
	before := len(srv.LogLines("nbd TLS handshake failed"))
	for _, dir := range []string{p.otherCADir, p.noCertDir, p.wrongCertDir} {
		if out, err := command("nbdinfo", tlsURI(t, srv, dir)); err == nil {
			t.Errorf("nbdinfo with %s got in: %s", filepath.Base(dir), out)
		}
	}
	// A client trusting another CA hangs up on the server's certificate; the server sees the
	// handshake fail like the two it refuses itself. It logs each failure when its own read of
	// the handshake ends, which can be after the client has exited: wait for the lines.
	for _, l := range srv.WaitLog(t, "nbd TLS handshake failed", before+3, 30*time.Second) {
		if !strings.Contains(l, "tcp:127.0.0.1:") {
			t.Errorf("failed handshake logged without the peer address: %s", l)
		}
	}
}

// checkRotation: after a new certificate and SIGHUP, a new client sees the new certificate; after
// a broken one (a key from another certificate) and SIGHUP, the server keeps the previous one.
func checkRotation(t *testing.T, srv *gateway.Server, p *pki) {
	host, port := hostPort(t, srv)
	addr := net.JoinHostPort(host, port)
	cert := p.rotate(t)
	srv.Signal(t, syscall.SIGHUP)
	srv.WaitLog(t, "TLS certificates reloaded", 1, 30*time.Second)
	if got := serverSerial(t, addr, p); got != cert.SerialNumber.String() {
		t.Fatalf("after SIGHUP the server presents serial %s, want the new %s", got, cert.SerialNumber)
	}
	broken, err := p.ca.Server("broken", time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.serverDir, "server-key.pem"), broken.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	srv.Signal(t, syscall.SIGHUP)
	srv.WaitLog(t, "TLS certificate reload failed; keeping the old certificates", 1, 30*time.Second)
	if got := serverSerial(t, addr, p); got != cert.SerialNumber.String() {
		t.Fatalf("after a failed reload the server presents serial %s, want %s", got, cert.SerialNumber)
	}
	checkNBDInfo(t, tlsURI(t, srv, p.clientDir))
}

// NBD wire values (proto.md) for the raw clients below.
const (
	magicNBD      = 0x4e42444d41474943
	magicOption   = 0x49484156454F5054
	optStartTLS   = 5
	optList       = 3
	repAck        = 1
	repErrTLSReqd = 1<<31 + 5
)

// negotiateRaw greets the server at addr as a fixed newstyle client and sends one option,
// returning the connection and the reply type.
func negotiateRaw(t *testing.T, addr string, opt uint32) (net.Conn, uint32) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(nc)
	var b [20]byte
	if _, err := io.ReadFull(br, b[:18]); err != nil || binary.BigEndian.Uint64(b[:]) != magicNBD {
		t.Fatalf("greeting: %v %x", err, b[:18])
	}
	msg := binary.BigEndian.AppendUint32(nil, 1) // NBD_FLAG_C_FIXED_NEWSTYLE
	msg = binary.BigEndian.AppendUint64(msg, magicOption)
	msg = binary.BigEndian.AppendUint32(msg, opt)
	msg = binary.BigEndian.AppendUint32(msg, 0)
	if _, err := nc.Write(msg); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(br, b[:20]); err != nil {
		t.Fatalf("option reply: %v", err)
	}
	if _, err := io.CopyN(io.Discard, br, int64(binary.BigEndian.Uint32(b[16:]))); err != nil {
		t.Fatal(err)
	}
	if br.Buffered() != 0 {
		t.Fatal("the server sent more than the option reply")
	}
	return nc, binary.BigEndian.Uint32(b[12:])
}

// plainOption sends NBD_OPT_LIST without TLS and returns the reply type.
func plainOption(t *testing.T, addr string) uint32 {
	_, typ := negotiateRaw(t, addr, optList)
	return typ
}

// serverSerial upgrades a raw connection with NBD_OPT_STARTTLS (with the good client's
// certificate) and returns the serial number of the certificate the server presents.
func serverSerial(t *testing.T, addr string, p *pki) string {
	t.Helper()
	nc, typ := negotiateRaw(t, addr, optStartTLS)
	if typ != repAck {
		t.Fatalf("STARTTLS answered %#x", typ)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(p.clientDir, "client-cert.pem"), filepath.Join(p.clientDir, "client-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(nc, &tls.Config{RootCAs: p.ca.Pool(), ServerName: "127.0.0.1", Certificates: []tls.Certificate{cert}})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("TLS handshake: %v", err)
	}
	defer tc.Close()
	return tc.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestServePlaintextOnlyOnLoopback: a tcp:// listener other hosts can reach does not start
// without TLS (exit 2, naming the fix), with --tls off it starts and warns; a broken certificate
// directory is exit 2 naming the file.
func TestServePlaintextOnlyOnLoopback(t *testing.T) {
	ns := netns.New(t)
	link := ns.AddLink(t) // a non-loopback address of this host, on a private veth
	target := fmt.Sprintf("mem://%d", 64<<20)
	for _, listen := range []string{"tcp://" + net.JoinHostPort(link.HostIP, "0"), "tcp://0.0.0.0:0", "tcp://[::]:0"} {
		out, code := serveExit(t, "serve", "--target", target, "--listen", listen)
		if code != 2 || !strings.Contains(out, "--tls require --tls-certificates DIR") || !strings.Contains(out, "--tls off") {
			t.Errorf("%s without --tls: exit %d, %s", listen, code, out)
		}
	}
	srv := gateway.StartListen(t, target, "tcp://"+net.JoinHostPort(link.HostIP, "0"), "--tls", "off")
	if !strings.HasPrefix(srv.URI, "nbd://"+link.HostIP+":") || len(srv.LogLines("plaintext on a non-loopback address")) != 1 {
		t.Errorf("--tls off: URI %s, log:\n%s", srv.URI, srv.Log())
	}
	srv.Stop(t)

	p := newPKI(t)
	if err := os.Remove(filepath.Join(p.serverDir, "server-key.pem")); err != nil {
		t.Fatal(err)
	}
	out, code := serveExit(t, "serve", "--target", target, "--listen", "tcp://127.0.0.1:0", "--tls", "require", "--tls-certificates", p.serverDir)
	if code != 2 || !strings.Contains(out, "server-key.pem") {
		t.Errorf("missing key: exit %d, %s", code, out)
	}
}

// serveExit runs the binary expecting it to exit on its own, and returns its output and code.
func serveExit(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, gateway.Binary(t), args...).CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("%v: %v", args, err)
	}
	if ee != nil {
		return string(out), ee.ExitCode()
	}
	return string(out), 0
}
