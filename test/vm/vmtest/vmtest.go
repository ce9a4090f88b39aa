//go:build vm

package vmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Environment the runner (test/vm/run.sh) sets in the guest.
const (
	EnvInVM     = "ISERBLK_IN_VM"        // "1" inside the guest
	EnvGuestDir = "ISERBLK_VM_GUEST_DIR" // directory of the guest helper scripts
	EnvResults  = "ISERBLK_VM_RESULTS"   // host directory shared read-write (logs worth keeping)
)

// ScriptTimeout bounds one helper script run; module loading and target setup under TCG on a
// busy 2-core host took up to ~40 s.
var ScriptTimeout = 3 * time.Minute

// fataler is the part of testing.TB that require needs (a fake in the tests).
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Require fails the test — it never skips — unless it runs inside the VM guest. Call it first in
// every vm-tagged test.
func Require(t testing.TB) {
	t.Helper()
	require(t, os.Getenv)
}

func require(t fataler, getenv func(string) string) {
	t.Helper()
	if getenv(EnvInVM) != "1" {
		t.Fatalf("this vm-tagged test runs only inside the QEMU guest (%s is not 1): "+
			"run `make test-vm`, or one test by hand: test/vm/run.sh go-test ./PKG -run TestName", EnvInVM)
	}
	if getenv(EnvGuestDir) == "" {
		t.Fatalf("%s is not set: the guest was not started by test/vm/run.sh", EnvGuestDir)
	}
}

// GuestDir is the directory holding the guest helper scripts.
func GuestDir(t testing.TB) string {
	t.Helper()
	Require(t)
	return os.Getenv(EnvGuestDir)
}

// ResultsDir is a host directory shared read-write with the guest (kept by the runner when the
// run fails); "" when the runner did not set one.
func ResultsDir() string { return os.Getenv(EnvResults) }

// RunScript runs guest helper NAME with ARGS and returns its KEY=VALUE output. It does not fail
// the test: negative tests (a refused login) need the error. stderr is returned for messages.
func RunScript(ctx context.Context, dir, name string, args ...string) (kv map[string]string, stderr string, err error) {
	ctx, cancel := context.WithTimeout(ctx, ScriptTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, name), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	// a daemon a helper starts (iscsid, tgtd) must not keep Run waiting on our pipes
	cmd.WaitDelay = 10 * time.Second
	runErr := cmd.Run()
	stderr = errb.String()
	if runErr != nil {
		return nil, stderr, fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), runErr, strings.TrimSpace(stderr))
	}
	kv, err = ParseKV(&out)
	if err != nil {
		return nil, stderr, fmt.Errorf("%s output: %w", name, err)
	}
	return kv, stderr, nil
}

// Script runs guest helper NAME and fails the test when it fails; its stderr goes to the test log.
func Script(t testing.TB, name string, args ...string) map[string]string {
	t.Helper()
	kv, stderr, err := RunScript(context.Background(), GuestDir(t), name, args...)
	if s := strings.TrimSpace(stderr); s != "" && err == nil {
		t.Log(s) // the helpers prefix their own lines with their name
	}
	if err != nil {
		t.Fatalf("guest helper: %v", err)
	}
	return kv
}

// need returns kv[key] or fails the test: a helper that stops printing a key broke its contract.
func need(t testing.TB, script string, kv map[string]string, key string) string {
	t.Helper()
	v, ok := kv[key]
	if !ok {
		t.Fatalf("%s printed no %s (got %v)", script, key, kv)
	}
	return v
}

func needInt(t testing.TB, script string, kv map[string]string, key string) int64 {
	t.Helper()
	v := need(t, script, kv, key)
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("%s printed %s=%q, not a number", script, key, v)
	}
	return n
}

// LoadModules loads kernel modules through modules.sh (names: nbd, ublk, brd, sd, rdma, lio,
// iscsi or any module name) and returns what it printed, e.g. NBD_DEV, UBLK_CONTROL, BRD_DEV.
func LoadModules(t testing.TB, names ...string) map[string]string {
	t.Helper()
	return Script(t, "modules.sh", names...)
}

// RXE is a soft-RoCE device on a dummy netdev.
type RXE struct {
	Dev    string // RDMA device name, "rxe0"
	Port   int    // its port, 1
	Netdev string // the dummy netdev under it
	Addr   string // its IPv4 address (exists only inside the guest)
}

// RXEUp brings soft-RoCE up (idempotent; it stays up for later tests in the same guest).
func RXEUp(t testing.TB) RXE {
	t.Helper()
	kv := Script(t, "rxe-up.sh")
	return RXE{
		Dev:    need(t, "rxe-up.sh", kv, "RDMA_DEV"),
		Port:   int(needInt(t, "rxe-up.sh", kv, "RDMA_PORT")),
		Netdev: need(t, "rxe-up.sh", kv, "RXE_NETDEV"),
		Addr:   need(t, "rxe-up.sh", kv, "RXE_ADDR"),
	}
}

// Credentials are a CHAP name and secret.
type Credentials struct{ User, Secret string }

func (c Credentials) arg() string { return c.User + ":" + c.Secret }

// LIOOptions configure lio-target.sh; the zero value is a 64 MiB RAM LUN on
// 192.168.77.1:3260 with TCP and iSER, open to any initiator, no CHAP.
type LIOOptions struct {
	IQN          string // default iqn.2003-01.org.linux-iscsi.iserblk-vm:target1
	File         bool   // fileio backstore instead of RAM
	FilePath     string // fileio backing file (default under /run)
	SizeMiB      int    // default 64
	BlockSize    int    // 512 or 4096; 0 = the backstore's default (512)
	Port         int    // default 3260
	NoISER       bool   // TCP only
	ACLs         []string
	CHAP         *Credentials // initiator -> target
	MutualCHAP   *Credentials // target -> initiator (needs CHAP)
	WriteProtect bool
}

// LIOTarget is a configured LIO target with one LUN.
type LIOTarget struct {
	IQN       string
	Addr      string
	Port      int
	Portal    string // Addr:Port
	LUN       int
	SizeBytes int64
	BlockSize int
	ISER      bool
	File      string // fileio backing file, "" for RAM
	RDMADev   string // "" without iSER
}

// StartLIO configures an LIO target and removes it when the test ends.
func StartLIO(t testing.TB, o LIOOptions) LIOTarget {
	t.Helper()
	tg := parseLIO(t, Script(t, lioScript, lioArgs(o)...))
	t.Cleanup(func() { tg.Teardown(t) })
	return tg
}

// StartLIOs is StartLIO for several targets (distinct IQNs), and tears them down the same way
// when the test ends: the first alone, since its helper makes what they share (the portal's
// address: run side by side, two helpers both add it and one fails, "RTNETLINK answers: File
// exists"), then the others four at a time. The 16-volume CSI test set its 17 targets up one
// by one in 39 s under TCG.
func StartLIOs(t testing.TB, opts []LIOOptions) []LIOTarget {
	t.Helper()
	if len(opts) == 0 {
		return nil
	}
	dir := GuestDir(t)
	kvs := make([]map[string]string, len(opts))
	// The helpers' stderr lines (what each target is) are left out: 17 of them say nothing
	// more than the targets' IQNs, which the test's own log names.
	start := func(i int) error {
		kv, _, err := RunScript(context.Background(), dir, lioScript, lioArgs(opts[i])...)
		kvs[i] = kv
		return err
	}
	for _, o := range opts {
		if o.IQN == "" {
			t.Fatal("StartLIOs: every target needs its own IQN")
		}
	}
	// Every target is torn down, whatever its helper did: --teardown is idempotent, and a helper
	// that failed half way leaves a target that a later test would find "exists already".
	t.Cleanup(func() {
		for _, err := range ForEach(len(opts), func(i int) error {
			_, _, err := RunScript(context.Background(), dir, lioScript, "--teardown", "--iqn", opts[i].IQN)
			return err
		}) {
			if err != nil {
				t.Errorf("guest helper: %v", err)
			}
		}
	})
	if err := start(0); err != nil {
		t.Fatalf("guest helper: %v", err)
	}
	for _, err := range ForEach(len(opts)-1, func(i int) error { return start(i + 1) }) {
		if err != nil {
			t.Fatalf("guest helper: %v", err)
		}
	}
	tgs := make([]LIOTarget, len(opts))
	for i := range opts {
		tgs[i] = parseLIO(t, kvs[i])
	}
	return tgs
}

// ForEach runs f(0..n-1), four at a time, and returns each one's error (f must not call t's
// Fatal: it runs on goroutines of its own).
func ForEach(n int, f func(i int) error) []error {
	errs := make([]error, n)
	slots := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			slots <- struct{}{}
			defer func() { <-slots }()
			errs[i] = f(i)
		}()
	}
	wg.Wait()
	return errs
}

const lioScript = "lio-target.sh"

// lioArgs are lio-target.sh's arguments for o.
func lioArgs(o LIOOptions) []string {
	var args []string
	if o.IQN != "" {
		args = append(args, "--iqn", o.IQN)
	}
	if o.File {
		args = append(args, "--backstore", "file")
		if o.FilePath != "" {
			args = append(args, "--file", o.FilePath)
		}
	}
	if o.SizeMiB != 0 {
		args = append(args, "--size-mib", strconv.Itoa(o.SizeMiB))
	}
	if o.BlockSize != 0 {
		args = append(args, "--block-size", strconv.Itoa(o.BlockSize))
	}
	if o.Port != 0 {
		args = append(args, "--port", strconv.Itoa(o.Port))
	}
	if o.NoISER {
		args = append(args, "--no-iser")
	}
	for _, a := range o.ACLs {
		args = append(args, "--acl", a)
	}
	if o.CHAP != nil {
		args = append(args, "--chap", o.CHAP.arg())
	}
	if o.MutualCHAP != nil {
		args = append(args, "--mutual-chap", o.MutualCHAP.arg())
	}
	if o.WriteProtect {
		args = append(args, "--write-protect")
	}
	return args
}

// parseLIO reads lio-target.sh's KEY=VALUE output.
func parseLIO(t testing.TB, kv map[string]string) LIOTarget {
	t.Helper()
	const s = lioScript
	tg := LIOTarget{
		IQN:       need(t, s, kv, "LIO_IQN"),
		Addr:      need(t, s, kv, "LIO_ADDR"),
		Port:      int(needInt(t, s, kv, "LIO_PORT")),
		Portal:    need(t, s, kv, "LIO_PORTAL"),
		LUN:       int(needInt(t, s, kv, "LIO_LUN")),
		SizeBytes: needInt(t, s, kv, "LIO_SIZE_BYTES"),
		BlockSize: int(needInt(t, s, kv, "LIO_BLOCK_SIZE")),
		ISER:      need(t, s, kv, "LIO_ISER") == "1",
		File:      kv["LIO_FILE"],
		RDMADev:   kv["RDMA_DEV"],
	}
	return tg
}

// Teardown removes the target now (StartLIO's cleanup calls it too; it is idempotent).
func (tg LIOTarget) Teardown(t testing.TB) {
	t.Helper()
	Script(t, lioScript, "--teardown", "--iqn", tg.IQN)
}

// URL is the iser-blk target URL for this LUN over the given scheme ("iscsi" or "iser").
func (tg LIOTarget) URL(scheme string) string {
	return fmt.Sprintf("%s://%s/%s/%d", scheme, tg.Portal, tg.IQN, tg.LUN)
}

// TgtOptions configure tgt-target.sh (tgtd); the zero value is a 64 MiB file LUN over iSER that
// admits open-iscsi's initiator name.
type TgtOptions struct {
	IQN        string
	SizeMiB    int
	TCP        bool     // --lld iscsi instead of iser
	Initiators []string // initiator names to admit (tgt's iSER path needs a name ACL)
}

// TgtTarget is a running tgtd target with LUN 1 (tgt's LUN 0 is its controller).
type TgtTarget struct {
	IQN        string
	TID        int
	LUN        int
	Addr       string
	ISERPortal string // always port 3260 (see tgt-target.sh)
	TCPPortal  string
	File       string
	SizeBytes  int64
	RDMADev    string
	Initiators string
}

// StartTgt starts tgtd with one target and stops tgtd when the test ends. tgtd's iSER listener
// is fixed to port 3260, so it cannot run while an LIO target has iSER on 3260.
func StartTgt(t testing.TB, o TgtOptions) TgtTarget {
	t.Helper()
	var args []string
	if o.IQN != "" {
		args = append(args, "--iqn", o.IQN)
	}
	if o.SizeMiB != 0 {
		args = append(args, "--size-mib", strconv.Itoa(o.SizeMiB))
	}
	if o.TCP {
		args = append(args, "--lld", "iscsi")
	}
	for _, i := range o.Initiators {
		args = append(args, "--initiator", i)
	}
	const s = "tgt-target.sh"
	kv := Script(t, s, args...)
	tg := TgtTarget{
		IQN:        need(t, s, kv, "TGT_IQN"),
		TID:        int(needInt(t, s, kv, "TGT_TID")),
		LUN:        int(needInt(t, s, kv, "TGT_LUN")),
		Addr:       need(t, s, kv, "TGT_ADDR"),
		ISERPortal: need(t, s, kv, "TGT_ISER_PORTAL"),
		TCPPortal:  need(t, s, kv, "TGT_TCP_PORTAL"),
		File:       need(t, s, kv, "TGT_FILE"),
		SizeBytes:  needInt(t, s, kv, "TGT_SIZE_BYTES"),
		RDMADev:    need(t, s, kv, "RDMA_DEV"),
		Initiators: need(t, s, kv, "TGT_INITIATORS"),
	}
	t.Cleanup(func() { Script(t, s, "--teardown") })
	return tg
}

// LoginOptions select an open-iscsi login (see open-iscsi.sh).
type LoginOptions struct {
	Portal     string // ip:port
	IQN        string
	LUN        int
	Transport  string // "tcp" (default) or "iser"
	Initiator  string // log in under this initiator name instead of /etc/iscsi's
	CHAP       *Credentials
	MutualCHAP *Credentials
}

func (o LoginOptions) args() []string {
	a := []string{"--portal", o.Portal, "--iqn", o.IQN, "--lun", strconv.Itoa(o.LUN)}
	if o.Transport != "" {
		a = append(a, "--transport", o.Transport)
	}
	if o.Initiator != "" {
		a = append(a, "--initiator", o.Initiator)
	}
	if o.CHAP != nil {
		a = append(a, "--chap", o.CHAP.arg())
	}
	if o.MutualCHAP != nil {
		a = append(a, "--mutual-chap", o.MutualCHAP.arg())
	}
	return a
}

// OpenISCSISession is a kernel iSCSI session made by open-iscsi: the reference initiator.
type OpenISCSISession struct {
	Dev       string // /dev/sdX
	SID       string
	Transport string
}

// ErrLoginRefused wraps a login the target refused (open-iscsi's authentication or authorization
// failure).
var ErrLoginRefused = errors.New("open-iscsi login refused")

// ErrLoginUnanswered wraps a login whose request got no answer before open-iscsi's login timeout
// (LIO over iSER may drop a connection it refuses instead of sending the refusal).
var ErrLoginUnanswered = errors.New("open-iscsi login got no answer")

// open-iscsi.sh's exit statuses for a refused and an unanswered login.
const (
	loginRefusedStatus    = 3
	loginUnansweredStatus = 4
)

// OpenISCSILogin logs in with Linux's own initiator and logs out when the test ends. It returns
// an error wrapping ErrLoginRefused when the target refuses the login, for tests that expect a
// refusal, or ErrLoginUnanswered when the login request got no answer; any other failure (iscsiadm
// itself not returning, a session without a disk) is a plain error, so that a hang is never taken
// for a refusal.
func OpenISCSILogin(t testing.TB, o LoginOptions) (OpenISCSISession, error) {
	t.Helper()
	const s = "open-iscsi.sh"
	kv, _, err := RunScript(context.Background(), GuestDir(t), s, append([]string{"login"}, o.args()...)...)
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			switch ee.ExitCode() {
			case loginRefusedStatus:
				return OpenISCSISession{}, fmt.Errorf("%w: %w", ErrLoginRefused, err)
			case loginUnansweredStatus:
				return OpenISCSISession{}, fmt.Errorf("%w: %w", ErrLoginUnanswered, err)
			}
		}
		return OpenISCSISession{}, err // a hang or a broken setup is not a refusal
	}
	sess := OpenISCSISession{
		Dev:       need(t, s, kv, "ISCSI_DEV"),
		SID:       need(t, s, kv, "ISCSI_SID"),
		Transport: need(t, s, kv, "ISCSI_TRANSPORT"),
	}
	logout := append([]string{"logout"}, o.args()...)
	t.Cleanup(func() { Script(t, s, logout...) })
	return sess, nil
}

// OpenISCSIInitiatorName is the guest's default open-iscsi initiator name (the host's, since the
// guest runs on the host's root filesystem).
func OpenISCSIInitiatorName(t testing.TB) string {
	t.Helper()
	return need(t, "open-iscsi.sh", Script(t, "open-iscsi.sh", "name"), "ISCSI_INITIATOR")
}
