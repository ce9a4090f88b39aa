//go:build vm

package tls_test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// TestNBDClientTLSKernel: the kernel's /dev/nbdX served over TLS under --tls-verify-peer, with
// certificates from issue #40's recipe (certtool's defaults, RSA keys). nbd-client runs the TLS
// session in user space (GnuTLS, TLS 1.2 in nbd-client 3.24) and hands the kernel a socket of
// its own; a 1 MiB O_DIRECT write reads back the same. nbd-client without a client certificate
// is refused. (The host e2e matrix runs nbd-client's handshake too, listing exports, but the
// host has no nbd module.)
func TestNBDClientTLSKernel(t *testing.T) {
	vmtest.Require(t)
	vmtest.LoadModules(t, "nbd")
	bin := os.Getenv("ISERBLK_BIN")
	if bin == "" {
		t.Fatal("ISERBLK_BIN is not set (test/vm/run.sh go-test builds the CLI)")
	}
	pki := makePKI(t, certtoolScript("", "", "", ""))
	server, client := filepath.Join(pki, "server"), filepath.Join(pki, "client")
	g := vmtest.StartGateway(t, exec.Command(bin, "serve", "--target", fmt.Sprintf("mem://%d", 64<<20),
		"--listen", "tcp://127.0.0.1:0", "--run-dir", t.TempDir(),
		"--tls", "require", "--tls-certificates", server, "--tls-verify-peer"), vmtest.GatewayOptions{})
	u, err := url.Parse(g.Device) // serve's first line is its URI
	if err != nil || u.Scheme != "nbds" {
		t.Fatalf("serve printed %q (%v), want an nbds:// URI", g.Device, err)
	}
	dev := freeNBD(t)
	nbdClient := func(withCert bool) ([]byte, error) {
		args := []string{"127.0.0.1", u.Port(), dev, "-N", "iser-blk", "-enable-tls", "-cacertfile", filepath.Join(client, "ca-cert.pem"),
			"-tlshostname", "127.0.0.1"}
		if withCert {
			args = append(args, "-certfile", filepath.Join(client, "client-cert.pem"), "-keyfile", filepath.Join(client, "client-key.pem"))
		}
		return exec.Command("nbd-client", args...).CombinedOutput()
	}

	if out, err := nbdClient(false); err == nil {
		exec.Command("nbd-client", "-d", dev).Run()
		t.Fatalf("nbd-client without a certificate got %s: %s", dev, out)
	}
	// The gateway logs the refusal when its handshake returns, which can be after nbd-client
	// has read the alert and exited: wait for the line.
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(g.Stderr.String(), "client didn't provide a certificate"); {
		if time.Now().After(deadline) {
			t.Fatalf("the refusal is not logged as such:\n%s", g.Stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}

	if out, err := nbdClient(true); err != nil {
		t.Fatalf("nbd-client with the RSA client certificate: %v\n%s", err, out)
	}
	connected := true
	disconnect := func() {
		if connected {
			if out, err := exec.Command("nbd-client", "-d", dev).CombinedOutput(); err != nil {
				t.Errorf("nbd-client -d %s: %v\n%s", dev, err, out)
			}
			connected = false
		}
	}
	t.Cleanup(disconnect)

	want := vmtest.AlignedBuf(1 << 20)
	rand.Read(want)
	f, err := os.OpenFile(dev, os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(want, 1<<20); err != nil {
		t.Fatalf("write %s: %v", dev, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync %s: %v", dev, err)
	}
	got := vmtest.AlignedBuf(1 << 20)
	if _, err := f.ReadAt(got, 1<<20); err != nil {
		t.Fatalf("read %s: %v", dev, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s read back different bytes", dev)
	}
	f.Close()
	disconnect()
	g.Stop()
}

// freeNBD returns an NBD device no one has connected (no pid in sysfs).
func freeNBD(t *testing.T) string {
	t.Helper()
	for i := range 16 {
		if !vmtest.NBDServed(fmt.Sprintf("/dev/nbd%d", i)) {
			if _, err := os.Stat(fmt.Sprintf("/dev/nbd%d", i)); err == nil {
				return fmt.Sprintf("/dev/nbd%d", i)
			}
		}
	}
	t.Fatal("no free /dev/nbdN")
	return ""
}
