//go:build e2e

// Package tgtd starts a private tgtd (the Linux SCSI target framework daemon, userspace iSCSI
// target) on 127.0.0.1 for end-to-end tests, with its own iSCSI port and control port so parallel
// test packages (and any tgtd already running) never clash, a file-backed LUN in /dev/shm,
// optional CHAP / mutual CHAP accounts and target parameter overrides. Everything is torn down by
// t.Cleanup. Requires root and the tgt package (tgtd, tgtadm).
//
// Readiness is established by polling tgtadm and the iSCSI port, never by sleeping a fixed time.
package tgtd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/internal/syncbuf"
)

// Account is a CHAP user known to the target.
type Account struct {
	User, Password string
}

// Options configures a target.
type Options struct {
	// Size of LUN 1 in bytes (default 64 MiB). The backing file is sparse, in /dev/shm.
	Size int64
	// BlockSize is LUN 1's logical block size (tgtadm --blocksize; default: tgt's 512).
	BlockSize int
	// TargetName is the IQN (default: a unique iqn.2026-11.io.iser-blk:e2e-<random>).
	TargetName string
	// CHAP, if set, is an incoming account: the initiator must authenticate as it.
	CHAP *Account
	// MutualCHAP, if set, is an outgoing account: the target authenticates to the initiator.
	MutualCHAP *Account
	// Params are target parameters set with `tgtadm --op update --mode target --name K --value V`
	// (ImmediateData, InitialR2T, HeaderDigest, DataDigest, MaxRecvDataSegmentLength,
	// MaxBurstLength, FirstBurstLength, ...).
	Params map[string]string
	// IOThreads is tgtd's -t (default 2).
	IOThreads int
	// NetNS runs tgtd (and tgtadm, whose control socket is per network namespace) inside this
	// network namespace (`ip netns exec`), listening on Addr:3260. Addr must be an address of
	// that namespace, reachable from the test (a veth pair the test made).
	NetNS, Addr string
}

// Target is a running tgtd with one target and LUN 1.
type Target struct {
	Portal      string // 127.0.0.1:PORT
	Port        int
	Name        string // target IQN
	LUN         uint64 // 1
	Size        int64
	BlockSize   int // 512 unless Options.BlockSize said otherwise
	BackingFile string
	ControlPort int
	TID         int

	opts Options
	mu   sync.Mutex
	proc *process // the running tgtd; nil after Kill
}

// process is one tgtd run.
type process struct {
	cmd    *exec.Cmd
	exited chan error // receives Wait's result once
	log    *syncbuf.Buffer
}

// kill stops the process with SIGKILL (tgtd ignores SIGTERM while targets exist) and reaps it.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	err := <-p.exited
	p.exited <- err
}

// Start starts tgtd and configures the target; t.Cleanup stops it and removes the backing file.
func Start(t testing.TB, opts Options) *Target {
	t.Helper()
	for _, bin := range []string{"tgtd", "tgtadm"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("tgtd fixture: %s not found (install the tgt package): %v", bin, err)
		}
	}
	if os.Geteuid() != 0 {
		t.Fatalf("tgtd fixture: needs root")
	}
	if opts.Size == 0 {
		opts.Size = 64 << 20
	}
	if opts.TargetName == "" {
		opts.TargetName = "iqn.2026-11.io.iser-blk:e2e-" + randHex(6)
	}
	if opts.IOThreads == 0 {
		opts.IOThreads = 2
	}
	var tg *Target
	var lastErr error
	for attempt := 0; attempt < 8; attempt++ {
		tg, lastErr = start(t, opts)
		if lastErr == nil {
			break
		}
		t.Logf("tgtd fixture: attempt %d: %v", attempt+1, lastErr)
	}
	if lastErr != nil {
		t.Fatalf("tgtd fixture: %v", lastErr)
	}
	return tg
}

func start(t testing.TB, opts Options) (*Target, error) {
	port, err := freeTCPPort()
	if err != nil {
		return nil, err
	}
	host := "127.0.0.1"
	if opts.NetNS != "" {
		host, port = opts.Addr, 3260 // a namespace of the test's own: the port is free
	}
	// The control port names an abstract unix socket; pick one unlikely to be in use.
	ctl := 1024 + int(randUint16()%31000) // tgtd accepts up to 32767
	tg := &Target{
		Portal: net.JoinHostPort(host, strconv.Itoa(port)), Port: port, Name: opts.TargetName,
		LUN: 1, Size: opts.Size, ControlPort: ctl, TID: 1, opts: opts,
	}
	if _, err := tg.tgtadm("--mode", "system", "--op", "show"); err == nil {
		return nil, fmt.Errorf("control port %d is already served by another tgtd", ctl)
	}
	p, err := tg.launch()
	if err != nil {
		return nil, err
	}
	tg.proc = p
	t.Cleanup(func() {
		tg.mu.Lock()
		if tg.proc != nil {
			tg.proc.kill()
		}
		tg.mu.Unlock()
		if tg.BackingFile != "" {
			os.Remove(tg.BackingFile)
		}
	})
	if err := tg.configure(opts); err != nil {
		return nil, fmt.Errorf("configuring tgtd: %w (tgtd log: %s)", err, p.log.String())
	}
	return tg, nil
}

// launch runs tgtd on tg's portal and control port and waits until it serves both.
func (tg *Target) launch() (*process, error) {
	p := &process{log: &syncbuf.Buffer{}, exited: make(chan error, 1)}
	cmd := tg.command(context.Background(), "tgtd", "-f", "-C", strconv.Itoa(tg.ControlPort), "-t", strconv.Itoa(tg.opts.IOThreads),
		"--iscsi", "portal="+tg.Portal)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting tgtd: %w", err)
	}
	p.cmd = cmd
	go func() { p.exited <- cmd.Wait() }()
	// Readiness: tgtadm answers on our control port and the iSCSI port accepts connections.
	deadline := time.Now().Add(10 * time.Second)
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case err := <-p.exited:
			p.exited <- err
			return nil, fmt.Errorf("tgtd exited during start-up (%v): %s", err, p.log.String())
		default:
		}
		// tgtd that cannot bind our portal falls back to 0.0.0.0:3260, so insist on seeing our
		// exact portal in its list before trusting the port.
		portals, aerr := tg.tgtadm("--mode", "portal", "--op", "show")
		if aerr == nil && !strings.Contains(portals, "Portal: "+tg.Portal+",") {
			if strings.Contains(p.log.String(), "failed to create/bind") {
				p.kill()
				return nil, fmt.Errorf("tgtd could not bind %s: %s", tg.Portal, p.log.String())
			}
			aerr = fmt.Errorf("portal %s not listed yet: %q", tg.Portal, portals)
		}
		if aerr == nil {
			c, derr := net.DialTimeout("tcp", tg.Portal, time.Second)
			if derr == nil {
				c.Close()
				return p, nil
			}
			aerr = derr
		}
		if time.Now().After(deadline) {
			p.kill()
			return nil, fmt.Errorf("tgtd not ready after 10 s: %v; log: %s", aerr, p.log.String())
		}
		<-poll.C
	}
}

// Kill kills tgtd with SIGKILL, as a crash would: connections are reset, the configuration
// (which tgtd keeps only in memory) is gone, the backing file and its data stay.
func (tg *Target) Kill() {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	if tg.proc != nil {
		tg.proc.kill()
		tg.proc = nil
	}
}

// Restart starts tgtd again after Kill on the same portal and control port and re-creates the
// target, LUN 1 on the same backing file (its data intact), the ACL, accounts and parameters.
// LUNs added with TGTAdm are not re-created.
func (tg *Target) Restart() error {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	if tg.proc != nil {
		return fmt.Errorf("tgtd is still running")
	}
	var p *process
	var err error
	// The port may linger briefly after the kill; retry the bind for a few seconds.
	for attempt := 0; attempt < 5; attempt++ {
		if p, err = tg.launch(); err == nil {
			break
		}
	}
	if err != nil {
		return err
	}
	tg.proc = p
	if err := tg.setup(tg.opts); err != nil {
		return fmt.Errorf("re-configuring tgtd: %w (tgtd log: %s)", err, p.log.String())
	}
	return nil
}

func (tg *Target) configure(opts Options) error {
	f, err := os.CreateTemp("/dev/shm", "iser-blk-e2e-*.img")
	if err != nil {
		return err
	}
	tg.BackingFile = f.Name()
	if err := f.Truncate(opts.Size); err != nil {
		f.Close()
		return err
	}
	f.Close()
	return tg.setup(opts)
}

// setup creates target, LUN 1 on tg.BackingFile, ACL, accounts and parameters.
func (tg *Target) setup(opts Options) error {
	tid := strconv.Itoa(tg.TID)
	lu := []string{"--mode", "logicalunit", "--op", "new", "--tid", tid, "--lun", "1", "--backing-store", tg.BackingFile}
	tg.BlockSize = 512
	if opts.BlockSize != 0 {
		lu = append(lu, "--blocksize", strconv.Itoa(opts.BlockSize))
		tg.BlockSize = opts.BlockSize
	}
	steps := [][]string{
		{"--mode", "target", "--op", "new", "--tid", tid, "--targetname", tg.Name},
		lu,
		{"--mode", "target", "--op", "bind", "--tid", tid, "--initiator-address", "ALL"},
	}
	if a := opts.CHAP; a != nil {
		steps = append(steps,
			[]string{"--mode", "account", "--op", "new", "--user", a.User, "--password", a.Password},
			[]string{"--mode", "account", "--op", "bind", "--tid", tid, "--user", a.User})
	}
	if a := opts.MutualCHAP; a != nil {
		steps = append(steps,
			[]string{"--mode", "account", "--op", "new", "--user", a.User, "--password", a.Password},
			[]string{"--mode", "account", "--op", "bind", "--tid", tid, "--user", a.User, "--outgoing"})
	}
	for _, s := range steps {
		if _, err := tg.tgtadm(s...); err != nil {
			return err
		}
	}
	for k, v := range opts.Params {
		if err := tg.Update(k, v); err != nil {
			return err
		}
	}
	return nil
}

// Update sets a target parameter (tgtadm --op update --mode target --name KEY --value V).
func (tg *Target) Update(key, value string) error {
	_, err := tg.tgtadm("--mode", "target", "--op", "update", "--tid", strconv.Itoa(tg.TID), "--name", key, "--value", value)
	return err
}

// Show returns `tgtadm --mode target --op show` (targets, LUNs with size and block size,
// accounts, ACLs) of this private tgtd.
func (tg *Target) Show() (string, error) {
	return tg.tgtadm("--mode", "target", "--op", "show")
}

// Params returns the target's iSCSI parameters (`tgtadm --mode target --op show --tid N`).
func (tg *Target) Params() (string, error) {
	return tg.tgtadm("--mode", "target", "--op", "show", "--tid", strconv.Itoa(tg.TID))
}

// TGTAdm runs tgtadm against this tgtd (lld iscsi, our control port).
func (tg *Target) TGTAdm(args ...string) (string, error) { return tg.tgtadm(args...) }

func (tg *Target) tgtadm(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	full := append([]string{"-C", strconv.Itoa(tg.ControlPort), "--lld", "iscsi"}, args...)
	out, err := tg.command(ctx, "tgtadm", full...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("tgtadm %s: %w: %s", redact(args), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// command runs name in the target's network namespace, if it has one.
func (tg *Target) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	if tg.opts.NetNS != "" {
		return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", tg.opts.NetNS, name}, args...)...)
	}
	return exec.CommandContext(ctx, name, args...)
}

// AddPortal makes tgtd listen on one more address ("IP:PORT"), e.g. a second interface of its
// namespace for multipath tests.
func (tg *Target) AddPortal(portal string) error {
	_, err := tg.tgtadm("--mode", "portal", "--op", "new", "--param", "portal="+portal)
	return err
}

// redact hides passwords in error messages.
func redact(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		if i > 0 && args[i-1] == "--password" {
			out[i] = "***"
		}
	}
	return strings.Join(out, " ")
}

// ReadBacking reads n bytes at off directly from the LUN's backing file (to cross-check what the
// initiator wrote).
func (tg *Target) ReadBacking(off int64, n int) ([]byte, error) {
	f, err := os.Open(filepath.Clean(tg.BackingFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		return nil, err
	}
	return b, nil
}

// ClosedPort returns a 127.0.0.1 port with nothing listening (for "portal unreachable" tests).
func ClosedPort(t testing.TB) string {
	t.Helper()
	p, err := freeTCPPort()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", p)
}

func freeTCPPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	a, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return 0, errors.New("not a TCP address")
	}
	return a.Port, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func randUint16() uint16 {
	var b [2]byte
	_, _ = rand.Read(b[:])
	return uint16(b[0])<<8 | uint16(b[1])
}

// Pause stops tgtd with SIGSTOP: connections stay up and nothing is answered, as a hung target
// or a partitioned network would; Resume (SIGCONT) lets it go on.
func (tg *Target) Pause() error { return tg.signal(syscall.SIGSTOP) }

// Resume continues tgtd after Pause.
func (tg *Target) Resume() error { return tg.signal(syscall.SIGCONT) }

func (tg *Target) signal(sig syscall.Signal) error {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	if tg.proc == nil {
		return fmt.Errorf("tgtd is not running")
	}
	return tg.proc.cmd.Process.Signal(sig)
}
