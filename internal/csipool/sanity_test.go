package csipool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// sanityIdentity is the least Identity service csi-sanity needs to reach the controller; the
// node plugin (internal/csi) has the real one.
type sanityIdentity struct {
	csi.UnimplementedIdentityServer
}

func (sanityIdentity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: "csi.iser-blk.io", VendorVersion: "sanity"}, nil
}

func (sanityIdentity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}},
	}}}, nil
}

func (sanityIdentity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

// sanityNode answers the node calls the controller suite makes (NodeGetInfo for the publish
// tests, which skip here; NodeUnpublishVolume in its cleanup) without a node behind it.
type sanityNode struct{ csi.UnimplementedNodeServer }

func (sanityNode) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: "sanity-node"}, nil
}

// NodeUnpublishVolume succeeds: nothing is ever published on this node, and unpublishing what is
// not published is success (CSI spec), which csi-sanity's cleanup relies on.
func (sanityNode) NodeUnpublishVolume(context.Context, *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

func (sanityNode) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil
}

// unsupportedSkips are the reasons csi-sanity may skip a controller spec for: capabilities a pool
// of pre-provisioned LUNs does not have (doc.go, "Not built here"). A skip for any other reason
// fails the test: a skip is not a pass.
var unsupportedSkips = []string{
	"Snapshot", "snapshot", "Cloning", "ControllerPublishVolume", "ControllerUnpublishVolume", "Publish",
	"ControllerExpandVolume", "ExpandVolume", "GetVolume", "ControllerGetVolume", "ModifyVolume", "Modify volume",
	"Modify Volume", "VolumeCondition", "VolumeHealth",
	"LIST_VOLUMES_PUBLISHED_NODES", "testnodevolumeattachlimit", "MaxVolumesPerNode",
}

// TestSanityController runs csi-sanity's controller specs (kubernetes-csi/csi-test, every spec
// tagged [Controller Server]) against the controller served over gRPC on a unix socket, with a
// pool of 1 GiB LUNs behind the fake prober. The suite checks idempotency, the gRPC codes and
// pagination as external-provisioner relies on them. Deleted volumes' LUNs go through the
// background erase (a fake eraser that succeeds), as in production.
func TestSanityController(t *testing.T) {
	dir := t.TempDir()
	var pool strings.Builder
	for n := 1; n <= 32; n++ {
		fmt.Fprintln(&pool, lunURL(n))
	}
	luns, err := ParsePool([]byte(pool.String()))
	if err != nil {
		t.Fatal(err)
	}
	prober := newFakeProber()
	for _, l := range luns {
		prober.set(l.Key, gib, nil)
	}
	eraser := newFakeEraser()
	c, err := New(Config{Pool: luns, ClaimsFile: filepath.Join(dir, "claims.json"), Prober: prober, Eraser: eraser, EraseRetry: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	sock := filepath.Join(dir, "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, sanityIdentity{})
	csi.RegisterControllerServer(srv, c)
	csi.RegisterNodeServer(srv, sanityNode{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	defer func() {
		srv.Stop()
		if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("gRPC server: %v", err)
		}
	}()

	cfg := sanity.NewTestConfig()
	cfg.Address = "unix://" + sock
	cfg.TargetPath = filepath.Join(dir, "target")
	cfg.StagingPath = filepath.Join(dir, "staging")
	cfg.TestVolumeSize = gib
	sc := sanity.GinkgoTest(&cfg)
	defer sc.Finalize()

	var passed, skipped, pending, failed int
	var badSkips []string
	reasons := map[string]int{}
	ginkgo.ReportAfterSuite("tally the controller specs", func(r ginkgo.Report) {
		for _, s := range r.SpecReports {
			if s.LeafNodeType != types.NodeTypeIt {
				continue
			}
			switch s.State {
			case types.SpecStatePassed:
				passed++
			case types.SpecStatePending:
				pending++ // disabled upstream (XIt)
			case types.SpecStateSkipped:
				if s.Failure.Message == "" {
					continue // filtered out by the focus: not a controller spec
				}
				skipped++
				reasons[s.Failure.Message]++
				if !supportedSkip(s.Failure.Message) {
					badSkips = append(badSkips, s.FullText()+": "+s.Failure.Message)
				}
			default:
				failed++
			}
		}
	})
	gomega.RegisterFailHandler(ginkgo.Fail)
	suite, reporter := ginkgo.GinkgoConfiguration()
	suite.FocusStrings = []string{`\[Controller Server\]`}
	reporter.Succinct = true
	reporter.NoColor = true // go test's output is a log, not a terminal
	if !ginkgo.RunSpecs(t, "csi-sanity: iser-blk pool controller", suite, reporter) {
		t.Error("csi-sanity failed (its report is above)")
	}
	t.Logf("csi-sanity controller specs: %d passed, %d failed, %d skipped for capabilities a pool does not have, %d pending upstream",
		passed, failed, skipped, pending)
	for _, r := range slices.Sorted(maps.Keys(reasons)) {
		t.Logf("  skipped %2d× %s", reasons[r], r)
	}
	if failed > 0 {
		t.Errorf("%d csi-sanity controller specs failed", failed)
	}
	if passed == 0 {
		t.Error("no csi-sanity controller spec passed: the focus matched nothing?")
	}
	for _, b := range badSkips {
		t.Errorf("skipped for a reason the pool should not have: %s", b)
	}
	// Every volume the suite made was deleted again, and its LUN erased: the claims file is
	// empty.
	for _, l := range luns {
		waitErased(t, c, l.Key)
	}
	if st, err := ReadClaims(filepath.Join(dir, "claims.json")); err != nil || len(st.Claims) != 0 || len(st.Erasing) != 0 {
		t.Errorf("after the suite: %d claims and %d erasing LUNs left, %v", len(st.Claims), len(st.Erasing), err)
	}
	if _, err := os.Stat(cfg.TargetPath); !os.IsNotExist(err) {
		t.Errorf("csi-sanity left %s behind: %v", cfg.TargetPath, err)
	}
}

func supportedSkip(msg string) bool {
	for _, s := range unsupportedSkips {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
