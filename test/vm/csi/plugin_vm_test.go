//go:build vm

package csivm

// The plugin process, the targets of its pool, and what the tests read back from the kernel
// (mounts, devices, LIO sessions, gateway processes).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/csipool"
	gwstatus "github.com/iser-blk/iser-blk/internal/status"
	"github.com/iser-blk/iser-blk/internal/syncbuf"
	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// probeInitiator is the IQN the pool controller reads the LUNs' sizes with (the LIO targets are
// in demo mode: any initiator may log in).
const probeInitiator = "iqn.2026-12.io.iser-blk:csi-vm-probe"

func binary(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("ISERBLK_BIN")
	if bin == "" {
		t.Fatal("ISERBLK_BIN is not set (test/vm/gotest.sh builds the CLI)")
	}
	return bin
}

// startPool starts n LIO targets of sizeMiB each (sparse files on /run, so an unwritten LUN
// costs the guest no memory), named iqn...:csi-PREFIX-I, and returns them.
func startPool(t testing.TB, prefix string, n, sizeMiB int, iser bool) []vmtest.LIOTarget {
	t.Helper()
	var tgs []vmtest.LIOTarget
	for i := range n {
		tgs = append(tgs, vmtest.StartLIO(t, vmtest.LIOOptions{
			IQN:  fmt.Sprintf("iqn.2003-01.org.linux-iscsi.iserblk-vm:csi-%s-%d", prefix, i),
			File: true, SizeMiB: sizeMiB, NoISER: !iser}))
	}
	return tgs
}

// writePool writes a pool file of urls, one LUN a line.
func writePool(t testing.TB, dir string, urls []string) string {
	t.Helper()
	path := filepath.Join(dir, "pool")
	if err := os.WriteFile(path, []byte(strings.Join(urls, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// plugin is an `iser-blk csi` process with its pool controller.
type plugin struct {
	args   []string
	sock   string
	runDir string
	claims string
	out    *syncbuf.Buffer // stdout and stderr of every incarnation
	cmd    *exec.Cmd
	exited chan struct{}
}

// startPlugin starts the plugin in dir (socket, run directory and claims file there) serving the
// pool file pool, and stops it when the test ends (after logging its output if the test
// failed).
func startPlugin(t testing.TB, dir, pool string) *plugin {
	t.Helper()
	p := &plugin{sock: filepath.Join(dir, "csi.sock"), runDir: filepath.Join(dir, "run"),
		claims: filepath.Join(dir, "claims.json"), out: &syncbuf.Buffer{}}
	p.args = []string{"csi", "--endpoint", "unix://" + p.sock, "--node-id", "vm-node",
		"--pool", pool, "--pool-claims", p.claims, "--initiator-name", probeInitiator,
		"--run-dir", p.runDir, "--debug"}
	p.start(t)
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("plugin output:\n%s", p.out)
			p.logGatewayLogs(t)
		}
	})
	return p
}

// start starts an incarnation of the plugin (with the same flags as every other).
func (p *plugin) start(t testing.TB) {
	t.Helper()
	cmd := exec.Command(binary(t), p.args...)
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(p.out, "--- plugin pid %d started\n", cmd.Process.Pid)
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	p.cmd, p.exited = cmd, exited
}

// kill9 kills the plugin with SIGKILL and waits until it is gone.
func (p *plugin) kill9(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 the plugin: %v", err)
	}
	<-p.exited
}

// stop ends the plugin the way its DaemonSet would (SIGTERM), SIGKILL after 30 s.
func (p *plugin) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

// dial connects to the plugin's socket and waits (up to 2 minutes) until Probe answers ready.
func (p *plugin) dial(t testing.TB) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+p.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	go func() { // a plugin that exits ends the wait for its socket at once
		select {
		case <-p.exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		r, err := csipb.NewIdentityClient(conn).Probe(ctx, &csipb.ProbeRequest{}, grpc.WaitForReady(true))
		if err == nil && r.GetReady().GetValue() {
			return conn
		}
		select {
		case <-p.exited: // before ctx: the goroutine above ends ctx when the plugin exits
			t.Fatalf("the plugin exited before it served:\n%s", p.out)
		default:
		}
		select {
		case <-p.exited:
			t.Fatalf("the plugin exited before it served:\n%s", p.out)
		case <-ctx.Done():
			t.Fatalf("the plugin is not ready after 2 minutes (last probe: %v, %v)", r, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// logGatewayLogs logs every gateway log in the run directory (for a failed test).
func (p *plugin) logGatewayLogs(t testing.TB) {
	logs, _ := filepath.Glob(filepath.Join(p.runDir, "csi", "*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		t.Logf("%s:\n%s", l, b)
	}
}

// detachAll detaches every gateway still in the run directory (a failed test's leftovers),
// after unmounting everything under dir, so that the targets can go.
func (p *plugin) detachAll(t testing.TB, dir string) {
	for _, m := range mountsUnder(dir) {
		exec.Command("umount", "-l", m).Run()
	}
	socks, _ := filepath.Glob(filepath.Join(p.runDir, "csi-*.sock"))
	for _, s := range socks {
		name := strings.TrimSuffix(filepath.Base(s), ".sock")
		out, err := exec.Command(binary(t), "detach", name, "--run-dir", p.runDir).CombinedOutput()
		t.Logf("cleanup: detach %s: %v %s", name, err, out)
	}
}

// gatewayStatus asks gateway name for its status through its control socket.
func gatewayStatus(t testing.TB, runDir, name string) gwstatus.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := control.Dial(ctx, runDir, name)
	if err != nil {
		t.Fatalf("gateway %s: %v", name, err)
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatalf("gateway %s status: %v", name, err)
	}
	return st
}

// mount is a line of /proc/self/mountinfo.
type mount struct {
	ID     string
	Point  string
	Source string
	FSType string
}

func mounts(t testing.TB) []mount {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var ms []mount
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		sep := -1
		for i, x := range f {
			if x == "-" {
				sep = i
				break
			}
		}
		if len(f) < 5 || sep < 0 || sep+2 >= len(f) {
			t.Fatalf("mountinfo line %q", l)
		}
		ms = append(ms, mount{ID: f[0], Point: f[4], FSType: f[sep+1], Source: f[sep+2]})
	}
	return ms
}

// mountAt returns the mount at path (the last one: the one visible there).
func mountAt(t testing.TB, path string) (mount, bool) {
	t.Helper()
	var m mount
	ok := false
	for _, x := range mounts(t) {
		if x.Point == path {
			m, ok = x, true
		}
	}
	return m, ok
}

// mountsUnder lists the mount points under dir, deepest first.
func mountsUnder(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var ps []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			ps = append([]string{f[4]}, ps...)
		}
	}
	return ps
}

// sessions lists the initiators logged in to LIO target iqn (demo mode: dynamic sessions).
func sessions(t testing.TB, iqn string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/kernel/config/target/iscsi", iqn, "tpgt_1/dynamic_sessions"))
	if err != nil {
		t.Fatalf("LIO sessions of %s: %v", iqn, err)
	}
	return strings.Fields(strings.ReplaceAll(string(b), "\x00", " "))
}

// processGone reports whether pid has exited (a zombie counts: its parent, the killed plugin,
// is gone and the guest's init may not reap promptly).
func processGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}

// eventually polls cond every 100 ms until it holds or within passes; then fails with what.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", within, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// mountCap and blockCap are single-node-writer capabilities.
func mountCap(fsType string) *csipb.VolumeCapability {
	return &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: fsType}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
}

// requireModules fails the test outside the guest and loads nbd and ublk.
func requireModules(t testing.TB) {
	t.Helper()
	vmtest.Require(t)
	vmtest.LoadModules(t, "nbd", "ublk")
}

// deviceOf returns the device gateway name serves, "" when it does not answer or does not serve.
func deviceOf(runDir, name string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := control.Dial(ctx, runDir, name)
	if err != nil {
		return ""
	}
	st, err := c.Status(ctx)
	if err != nil || st.Gateway.State != "ready" {
		return ""
	}
	return st.Gateway.FrontendPath
}

// claimsEmpty requires the claims file to end up with no claim and no LUN being erased: every
// volume deleted and every deleted volume's LUN zeroed (csipool erases in the background).
func claimsEmpty(t testing.TB, file, what string) {
	t.Helper()
	eventually(t, time.Minute, what, func() bool {
		c, err := csipool.ReadClaims(file)
		return err == nil && len(c.Claims) == 0 && len(c.Erasing) == 0
	})
}
