//go:build vm

package csivm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"

	"github.com/iser-blk/iser-blk/internal/csi"
	"github.com/iser-blk/iser-blk/internal/csipool"
	"github.com/iser-blk/iser-blk/internal/syncbuf"
)

// sanityChildEnv holds a sanityRun (JSON): the test binary, started with it, runs csi-sanity
// instead of its tests (Ginkgo runs one suite per process, and TestVMSanity runs two).
const sanityChildEnv = "ISERBLK_CSI_SANITY_RUN"

func TestMain(m *testing.M) {
	if cfg := os.Getenv(sanityChildEnv); cfg != "" {
		os.Exit(runSanityChild(cfg))
	}
	os.Exit(m.Run())
}

// sanityDeselect are the csi-sanity specs not run, each for a capability the plugin does not
// advertise (a pool of pre-provisioned LUNs has no snapshots, clones, expansion or attach step;
// the node offers single-node-writer access only). Every other spec runs, and must pass: one
// that skips itself at run time fails TestVMSanity.
var sanityDeselect = []struct{ re, why string }{
	{`(?i)snapshot`, "no snapshots (CREATE_DELETE_SNAPSHOT, LIST_SNAPSHOTS, group snapshots)"},
	{`from an existing source volume|volume source volume`, "no clones (CLONE_VOLUME)"},
	{`ExpandVolume`, "no expansion (EXPAND_VOLUME, controller and node)"},
	{`ModifyVolume|volume attribute class`, "no MODIFY_VOLUME"},
	{`ControllerGetVolumeHealth|ControllerListVolumeHealth`, "no controller volume health (GET_VOLUME, LIST_VOLUMES volume condition)"},
	{`GroupController`, "no group controller service"},
	{`ControllerPublishVolume|ControllerUnpublishVolume|volume lifecycle`, "no PUBLISH_UNPUBLISH_VOLUME (the node logs in itself)"},
	{`single node multi writer`, "no SINGLE_NODE_MULTI_WRITER"},
	{`NodeGetStorageHealth`, "no node storage health"},
}

// sanityRun is one csi-sanity run's configuration, handed to the child process.
type sanityRun struct {
	Address    string
	AccessType string            // "mount" or "block"
	Parameters map[string]string // the StorageClass parameters CreateVolume gets
	SizeBytes  int64
	Dir        string // the staging and target paths go under it
	Report     string // where the child writes its sanityReport
}

// sanityReport is what a child saw: Ginkgo's spec states.
type sanityReport struct {
	Passed, Failed, Pending, Deselected int
	SelfSkipped                         []string // specs that called Skip: none may
	Failures                            []string
	Specs                               int
}

type ginkgoT struct{ failed bool }

func (g *ginkgoT) Fail() { g.failed = true }

// runSanityChild runs csi-sanity as cfgJSON says and writes its report; the exit status is 0
// when the report was written (the parent judges it).
func runSanityChild(cfgJSON string) int {
	var run sanityRun
	if err := json.Unmarshal([]byte(cfgJSON), &run); err != nil {
		fmt.Fprintln(os.Stderr, "sanity child:", err)
		return 2
	}
	cfg := sanity.NewTestConfig()
	cfg.Address = run.Address
	cfg.TargetPath = filepath.Join(run.Dir, "target")
	cfg.StagingPath = filepath.Join(run.Dir, "staging")
	cfg.TestVolumeSize = run.SizeBytes
	cfg.TestVolumeAccessType = run.AccessType
	cfg.TestVolumeParameters = run.Parameters
	cfg.TestNodeVolumeAttachLimit = true
	cfg.IdempotentCount = 3
	sc := sanity.GinkgoTest(&cfg)
	var rep sanityReport
	ginkgo.ReportAfterSuite("tally", func(r ginkgo.Report) {
		for _, s := range r.SpecReports {
			if s.LeafNodeType != types.NodeTypeIt {
				continue
			}
			rep.Specs++
			switch s.State {
			case types.SpecStatePassed:
				rep.Passed++
			case types.SpecStatePending:
				rep.Pending++
			case types.SpecStateSkipped:
				if s.Failure.Message == "" {
					rep.Deselected++
				} else {
					rep.SelfSkipped = append(rep.SelfSkipped, s.FullText()+": "+s.Failure.Message)
				}
			default:
				rep.Failed++
				rep.Failures = append(rep.Failures, s.FullText()+": "+s.Failure.Message)
			}
		}
	})
	gomega.RegisterFailHandler(ginkgo.Fail)
	suite, reporter := ginkgo.GinkgoConfiguration()
	for _, d := range sanityDeselect {
		suite.SkipStrings = append(suite.SkipStrings, d.re)
	}
	suite.Timeout = 20 * time.Minute
	reporter.Succinct = true
	reporter.NoColor = true
	ginkgo.RunSpecs(&ginkgoT{}, "csi-sanity "+run.AccessType, suite, reporter)
	sc.Finalize()
	b, _ := json.Marshal(rep)
	if err := os.WriteFile(run.Report, b, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "sanity child:", err)
		return 2
	}
	return 0
}

// TestVMSanity: csi-sanity v5.6.0 against the real plugin, node and pool controller in one
// process, twice: Filesystem volumes (ext4) over iSER on nbd devices, and Block volumes over
// iSCSI/TCP on ublk devices. The StorageClass parameters (transport, frontend) reach the node
// through the pool's volume context, so each run's volumes are of its kind. Every selected spec
// passes and none skips; afterwards no claim, gateway record, mount or LIO session is left.
func TestVMSanity(t *testing.T) {
	requireModules(t)
	const lunMiB = 64
	// csi-sanity holds at most 2 volumes at a time (the CreateVolume idempotency specs; the
	// node specs 1); three per transport leave one spare. Each target costs seconds to set up.
	iserTgs := startPool(t, "iser", 3, lunMiB, true)
	tcpTgs := startPool(t, "tcp", 3, lunMiB, true)
	var urls []string
	for _, tg := range iserTgs {
		urls = append(urls, tg.URL("iser"))
	}
	for _, tg := range tcpTgs {
		urls = append(urls, tg.URL("iscsi"))
	}
	dir := t.TempDir()
	p := startPlugin(t, dir, writePool(t, dir, urls))
	t.Cleanup(func() {
		if t.Failed() {
			p.detachAll(t, dir)
		}
	})
	p.dial(t)

	runs := []struct {
		name, access string
		params       map[string]string
		device       *regexp.Regexp
	}{
		{"mount-iser-nbd", "mount", map[string]string{csipool.ContextTransport: "iser", csipool.ContextFrontend: "nbd"}, regexp.MustCompile(`^/dev/nbd\d+$`)},
		{"block-iscsi-ublk", "block", map[string]string{csipool.ContextTransport: "iscsi", csipool.ContextFrontend: "ublk"}, regexp.MustCompile(`^/dev/ublkb\d+$`)},
	}
	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) {
			sdir := filepath.Join(dir, r.name)
			if err := os.MkdirAll(sdir, 0o700); err != nil {
				t.Fatal(err)
			}
			devices := watchDevices(t, p.runDir)
			rep := runSanity(t, sanityRun{Address: "unix://" + p.sock, AccessType: r.access, Parameters: r.params,
				SizeBytes: lunMiB << 20, Dir: sdir, Report: filepath.Join(sdir, "report.json")})
			t.Logf("csi-sanity %s: %d specs, %d passed, %d failed, %d skipped at run time, %d deselected (capabilities not offered), %d pending upstream",
				r.access, rep.Specs, rep.Passed, rep.Failed, len(rep.SelfSkipped), rep.Deselected, rep.Pending)
			for _, f := range rep.Failures {
				t.Errorf("failed: %s", f)
			}
			for _, s := range rep.SelfSkipped {
				t.Errorf("skipped at run time (a skip is not a pass): %s", s)
			}
			if rep.Failed != 0 || len(rep.SelfSkipped) != 0 {
				t.Errorf("%d failed, %d skipped: want 0 and 0", rep.Failed, len(rep.SelfSkipped))
			}
			if rep.Passed < 40 {
				t.Errorf("only %d specs passed: the selection lost specs?", rep.Passed)
			}
			// The stages were real: every gateway of this run served a device of the frontend
			// its parameters asked for.
			seen := devices()
			if len(seen) == 0 {
				t.Errorf("no gateway served a device during the run")
			}
			for name, dev := range seen {
				if !r.device.MatchString(dev) {
					t.Errorf("gateway %s served %s, want %v", name, dev, r.device)
				}
			}
			t.Logf("devices the run's stages made: %v", seen)
		})
	}

	// Nothing is left: no claim, no staged volume, no gateway, no session, no mount.
	// a deleted volume's LUN is erased in the background before it is free again
	claimsEmpty(t, p.claims, "claims left after the runs")
	if names, err := csi.RecordsIn(p.runDir).Names(); err != nil || len(names) != 0 {
		t.Errorf("staged volumes left: %v, %v", names, err)
	}
	if socks, _ := filepath.Glob(filepath.Join(p.runDir, "csi-*.sock")); len(socks) != 0 {
		t.Errorf("gateways left: %v", socks)
	}
	if ms := mountsUnder(dir); len(ms) != 0 {
		t.Errorf("mounts left: %v", ms)
	}
	for _, tg := range append(iserTgs, tcpTgs...) {
		eventually(t, 30*time.Second, "a session is left on "+tg.IQN, func() bool { return len(sessions(t, tg.IQN)) == 0 })
	}
}

// runSanity runs csi-sanity in a child process and returns its report.
func runSanity(t *testing.T, run sanityRun) sanityReport {
	t.Helper()
	cfg, err := json.Marshal(run)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	out := &syncbuf.Buffer{}
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), sanityChildEnv+"="+string(cfg))
	cmd.Stdout, cmd.Stderr = out, out
	t0 := time.Now()
	err = cmd.Run()
	t.Logf("csi-sanity %s ran %v", run.AccessType, time.Since(t0).Round(time.Second))
	b, rerr := os.ReadFile(run.Report)
	if err != nil || rerr != nil {
		t.Fatalf("csi-sanity child: %v, report: %v\n%s", err, rerr, out)
	}
	var rep sanityReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("csi-sanity report: %v", err)
	}
	if rep.Failed != 0 || len(rep.SelfSkipped) != 0 {
		t.Logf("csi-sanity output:\n%s", out)
	} else {
		t.Logf("csi-sanity output (tail):\n%s", tail(out.String(), 8))
	}
	return rep
}

// watchDevices records, until the returned function is called, the device of every gateway that
// appears in runDir (read from its status). csi-sanity stages and unstages quickly, so the
// gateways are polled while it runs.
func watchDevices(t *testing.T, runDir string) func() map[string]string {
	seen := map[string]string{}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			socks, _ := filepath.Glob(filepath.Join(runDir, "csi-*.sock"))
			for _, s := range socks {
				name := strings.TrimSuffix(filepath.Base(s), ".sock")
				if _, ok := seen[name]; ok {
					continue
				}
				if dev := deviceOf(runDir, name); dev != "" {
					seen[name] = dev
				}
			}
			select {
			case <-done:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	var once bool
	stop := func() map[string]string {
		if !once {
			once = true
			close(done)
			<-stopped
		}
		return seen
	}
	t.Cleanup(func() { stop() })
	return stop
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
