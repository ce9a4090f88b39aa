package csipool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const gib = int64(1) << 30

// fakeProber answers sizes by LUN key, or an error; it counts the probes.
type fakeProber struct {
	mu    sync.Mutex
	sizes map[string]int64
	fail  map[string]error
	calls map[string]int
}

func newFakeProber() *fakeProber {
	return &fakeProber{sizes: map[string]int64{}, fail: map[string]error{}, calls: map[string]int{}}
}

func (p *fakeProber) Size(ctx context.Context, l LUN) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls[l.Key]++
	if err := p.fail[l.Key]; err != nil {
		return 0, err
	}
	if s, ok := p.sizes[l.Key]; ok {
		return s, nil
	}
	return 0, errors.New("no such LUN")
}

func (p *fakeProber) set(key string, size int64, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sizes[key], p.fail[key] = size, err
}

func (p *fakeProber) count(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[key]
}

// fakeClock is a clock the test steps.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// lunKey is the key of LUN n of the test pool; lunURL its URL (iser:// from 100 up).
func lunKey(n int) string { return fmt.Sprintf("iqn.2026-12.io.iser-blk:pool/%d", n) }
func lunURL(n int) string {
	scheme := "iscsi"
	if n >= 100 {
		scheme = "iser"
	}
	return fmt.Sprintf("%s://192.0.2.10:3260/%s", scheme, lunKey(n))
}

// rig is a controller on a pool of LUNs with the given sizes (by LUN number; 0: the probe fails).
type rig struct {
	c      *Controller
	prober *fakeProber
	eraser *fakeEraser
	clock  *fakeClock
	logs   *observer.ObservedLogs
	claims string
	cfg    Config
}

func newRig(t *testing.T, sizes map[int]int64) *rig {
	t.Helper()
	nums := make([]int, 0, len(sizes))
	for n := range sizes {
		nums = append(nums, n)
	}
	sort.Ints(nums)
	var text strings.Builder
	r := &rig{prober: newFakeProber(), eraser: newFakeEraser(), clock: &fakeClock{now: time.Date(2026, 12, 5, 1, 0, 0, 0, time.UTC)}}
	for _, n := range nums {
		fmt.Fprintln(&text, lunURL(n))
		if sizes[n] > 0 {
			r.prober.set(lunKey(n), sizes[n], nil)
		} else {
			r.prober.set(lunKey(n), 0, errors.New("portal unreachable"))
		}
	}
	pool, err := ParsePool([]byte(text.String()))
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	r.logs = logs
	r.claims = filepath.Join(t.TempDir(), "state", "claims.json")
	r.cfg = Config{Pool: pool, ClaimsFile: r.claims, Prober: r.prober, Eraser: r.eraser, EraseRetry: time.Millisecond,
		ProbeRetry: time.Minute, Logger: zap.New(core), Now: r.clock.Now}
	r.c = r.open(t)
	return r
}

func (r *rig) open(t *testing.T) *Controller {
	t.Helper()
	c, err := New(r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func mountCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

func blockCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func createReq(name string, required, limit int64, params map[string]string) *csi.CreateVolumeRequest {
	return &csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: required, LimitBytes: limit},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
		Parameters:         params,
	}
}

func wantCode(t *testing.T, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("error %v, want code %v", err, code)
	}
}

func (r *rig) create(t *testing.T, name string, required, limit int64, params map[string]string) *csi.Volume {
	t.Helper()
	resp, err := r.c.CreateVolume(context.Background(), createReq(name, required, limit, params))
	if err != nil {
		t.Fatalf("CreateVolume(%s): %v", name, err)
	}
	return resp.GetVolume()
}

func TestCreateVolumeBestFit(t *testing.T) {
	r := newRig(t, map[int]int64{1: 10 * gib, 2: 1 * gib, 3: 5 * gib, 100: 2 * gib})
	v := r.create(t, "a", 2*gib, 0, nil)
	if v.GetCapacityBytes() != 2*gib || v.GetVolumeContext()[ContextTarget] != lunURL(100) || v.GetVolumeContext()[ContextTransport] != "iser" {
		t.Fatalf("2 GiB went to %+v, want the iser LUN of exactly 2 GiB", v)
	}
	if !validID(v.GetVolumeId()) {
		t.Fatalf("volume ID %q", v.GetVolumeId())
	}
	v = r.create(t, "b", 2*gib, 0, map[string]string{"frontend": "nbd", "cache": "wb"})
	if v.GetCapacityBytes() != 5*gib || v.GetVolumeContext()[ContextTarget] != lunURL(3) {
		t.Fatalf("the second 2 GiB went to %+v, want LUN 3 (5 GiB)", v)
	}
	if f, c := v.GetVolumeContext()[ContextFrontend], v.GetVolumeContext()[ContextCache]; f != "nbd" || c != "writeback" {
		t.Fatalf("context frontend %q, cache %q: the parameters' (cache by its canonical name)", f, c)
	}
	if v := r.create(t, "c", 0, 0, nil); v.GetCapacityBytes() != 1*gib {
		t.Fatalf("no range went to %d bytes, want the smallest LUN", v.GetCapacityBytes())
	}
	if _, err := r.c.CreateVolume(context.Background(), createReq("d", 0, 0, map[string]string{"transport": "iser"})); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("the only iser LUN is claimed: %v, want ResourceExhausted", err)
	}
	if v := r.create(t, "d", 6*gib, 20*gib, map[string]string{"transport": "iscsi"}); v.GetCapacityBytes() != 10*gib {
		t.Fatalf("6 to 20 GiB went to %d bytes", v.GetCapacityBytes())
	}
	_, err := r.c.CreateVolume(context.Background(), createReq("e", 0, 0, nil))
	wantCode(t, err, codes.ResourceExhausted)
	for _, n := range []int{1, 2, 3, 100} {
		if c := r.prober.count(lunKey(n)); c > 1 {
			t.Errorf("LUN %d probed %d times; sizes are cached", n, c)
		}
	}
}

func TestCreateVolumeIdempotent(t *testing.T) {
	r := newRig(t, map[int]int64{1: 4 * gib, 2: 8 * gib})
	v1 := r.create(t, "pvc-1", 4*gib, 4*gib, map[string]string{"cache": "off"})
	v2 := r.create(t, "pvc-1", 4*gib, 4*gib, map[string]string{"cache": "none"}) // the same mode, spelt otherwise
	if v1.GetVolumeId() != v2.GetVolumeId() || v2.GetCapacityBytes() != 4*gib {
		t.Fatalf("the same request twice: %+v then %+v", v1, v2)
	}
	if v3 := r.create(t, "pvc-1", 1*gib, 0, map[string]string{"cache": "off"}); v3.GetVolumeId() != v1.GetVolumeId() {
		t.Fatalf("a range the volume satisfies made another volume %s", v3.GetVolumeId())
	}
	for _, tc := range []struct {
		name            string
		required, limit int64
		params          map[string]string
	}{
		{"larger", 8 * gib, 8 * gib, map[string]string{"cache": "off"}},
		{"limit below", 1 * gib, 2 * gib, map[string]string{"cache": "off"}},
		{"other cache", 4 * gib, 0, map[string]string{"cache": "writeback"}},
		{"cache left to the node", 4 * gib, 0, nil},
		{"other transport", 4 * gib, 0, map[string]string{"cache": "off", "transport": "iser"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.c.CreateVolume(context.Background(), createReq("pvc-1", tc.required, tc.limit, tc.params))
			wantCode(t, err, codes.AlreadyExists)
		})
	}
	list, err := r.c.ListVolumes(context.Background(), &csi.ListVolumesRequest{})
	if err != nil || len(list.GetEntries()) != 1 {
		t.Fatalf("ListVolumes: %d entries, %v; want the one volume", len(list.GetEntries()), err)
	}
}

func TestCreateVolumeOutOfRangeAndUnknownSizes(t *testing.T) {
	r := newRig(t, map[int]int64{1: 1 * gib, 2: 2 * gib})
	_, err := r.c.CreateVolume(context.Background(), createReq("big", 3*gib, 0, nil))
	wantCode(t, err, codes.OutOfRange)
	if !strings.Contains(err.Error(), "1×1073741824 1×2147483648") {
		t.Errorf("the message does not list the free sizes: %v", err)
	}
	_, err = r.c.CreateVolume(context.Background(), createReq("small", 1, gib/2, nil))
	wantCode(t, err, codes.OutOfRange)

	// With a LUN of unknown size, it might fit once it answers: not OutOfRange.
	r = newRig(t, map[int]int64{1: 1 * gib, 2: 0})
	_, err = r.c.CreateVolume(context.Background(), createReq("big", 3*gib, 0, nil))
	wantCode(t, err, codes.ResourceExhausted)
}

func TestCreateVolumeInvalidArguments(t *testing.T) {
	r := newRig(t, map[int]int64{1: 1 * gib})
	ok := func() *csi.CreateVolumeRequest { return createReq("v", 0, 0, nil) }
	for _, tc := range []struct {
		name   string
		mutate func(*csi.CreateVolumeRequest)
	}{
		{"no name", func(q *csi.CreateVolumeRequest) { q.Name = "" }},
		{"long name", func(q *csi.CreateVolumeRequest) { q.Name = strings.Repeat("n", 129) }},
		{"no capabilities", func(q *csi.CreateVolumeRequest) { q.VolumeCapabilities = nil }},
		{"nil capability", func(q *csi.CreateVolumeRequest) { q.VolumeCapabilities = []*csi.VolumeCapability{nil} }},
		{"multi-node writer", func(q *csi.CreateVolumeRequest) {
			q.VolumeCapabilities = []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)}
		}},
		{"one good, one multi-node reader", func(q *csi.CreateVolumeRequest) {
			q.VolumeCapabilities = append(q.VolumeCapabilities, mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY))
		}},
		{"no access mode", func(q *csi.CreateVolumeRequest) { q.VolumeCapabilities[0].AccessMode = nil }},
		{"no access type", func(q *csi.CreateVolumeRequest) { q.VolumeCapabilities[0].AccessType = nil }},
		{"btrfs", func(q *csi.CreateVolumeRequest) { q.VolumeCapabilities[0].GetMount().FsType = "btrfs" }},
		{"negative size", func(q *csi.CreateVolumeRequest) { q.CapacityRange.RequiredBytes = -1 }},
		{"limit below required", func(q *csi.CreateVolumeRequest) {
			q.CapacityRange = &csi.CapacityRange{RequiredBytes: 2, LimitBytes: 1}
		}},
		{"unknown parameter", func(q *csi.CreateVolumeRequest) { q.Parameters = map[string]string{"cahce": "off"} }},
		{"bad frontend", func(q *csi.CreateVolumeRequest) { q.Parameters = map[string]string{"frontend": "loop"} }},
		{"content source", func(q *csi.CreateVolumeRequest) {
			q.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "x"}}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := ok()
			tc.mutate(q)
			_, err := r.c.CreateVolume(context.Background(), q)
			wantCode(t, err, codes.InvalidArgument)
		})
	}
	// None of them claimed anything: the LUN is still free, and a block volume may have it.
	q := ok()
	q.VolumeCapabilities = []*csi.VolumeCapability{blockCap()}
	if _, err := r.c.CreateVolume(context.Background(), q); err != nil {
		t.Fatalf("a valid block request after the invalid ones: %v", err)
	}
}

func TestDeleteVolume(t *testing.T) {
	r := newRig(t, map[int]int64{1: 1 * gib})
	ctx := context.Background()
	_, err := r.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{})
	wantCode(t, err, codes.InvalidArgument)
	if _, err := r.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "never-made"}); err != nil {
		t.Fatalf("an unknown ID: %v, want success", err)
	}
	v := r.create(t, "a", 0, 0, nil)
	_, err = r.c.CreateVolume(ctx, createReq("b", 0, 0, nil))
	wantCode(t, err, codes.ResourceExhausted)
	for range 2 { // the second is a retry: still success
		if _, err := r.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
	}
	waitErased(t, r.c, lunKey(1))
	w := r.create(t, "b", 0, 0, nil)
	if w.GetVolumeId() == v.GetVolumeId() || w.GetVolumeContext()[ContextTarget] != v.GetVolumeContext()[ContextTarget] {
		t.Fatalf("after the delete: %+v, want the same LUN under a new ID (was %s)", w, v.GetVolumeId())
	}
	// A stale delete of the old ID must not free the LUN now held by the new volume.
	if _, err := r.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	_, err = r.c.CreateVolume(ctx, createReq("c", 0, 0, nil))
	wantCode(t, err, codes.ResourceExhausted)
	if n := r.prober.count(lunKey(1)); n != 1 {
		t.Errorf("LUN probed %d times; a deleted volume's size is known", n)
	}
}

func TestClaimsSurviveRestart(t *testing.T) {
	r := newRig(t, map[int]int64{1: 1 * gib, 2: 2 * gib, 3: 3 * gib})
	a := r.create(t, "a", 2*gib, 0, map[string]string{"frontend": "ublk"})
	b := r.create(t, "b", 0, 0, nil)
	if err := r.c.Close(); err != nil {
		t.Fatal(err)
	}
	c := r.open(t)
	list, err := c.ListVolumes(context.Background(), &csi.ListVolumesRequest{})
	if err != nil || len(list.GetEntries()) != 2 {
		t.Fatalf("after a restart: %d volumes, %v; want 2", len(list.GetEntries()), err)
	}
	resp, err := c.CreateVolume(context.Background(), createReq("a", 2*gib, 0, map[string]string{"frontend": "ublk"}))
	if err != nil || resp.GetVolume().GetVolumeId() != a.GetVolumeId() {
		t.Fatalf("the name a after a restart: %v, %v; want %s", resp, err, a.GetVolumeId())
	}
	resp, err = c.CreateVolume(context.Background(), createReq("c", 0, 0, nil))
	if err != nil {
		t.Fatal(err)
	}
	got := resp.GetVolume().GetVolumeContext()[ContextTarget]
	if got == a.GetVolumeContext()[ContextTarget] || got == b.GetVolumeContext()[ContextTarget] || got != lunURL(3) {
		t.Fatalf("after a restart the free LUN handed out is %s, want LUN 3", got)
	}
	st, err := ReadClaims(r.claims)
	if err != nil || len(st.Claims) != 3 {
		t.Fatalf("claims file: %d claims, %v", len(st.Claims), err)
	}
}

func TestNewWritesTheClaimsFile(t *testing.T) {
	r := newRig(t, map[int]int64{1: 1 * gib})
	if st, err := ReadClaims(r.claims); err != nil || len(st.Claims) != 0 || len(st.Erasing) != 0 {
		t.Fatalf("after the first start: %v, %v; want an empty claims file", st, err)
	}
	r.c.Close()
	// A claims location that cannot be written fails the start, not the first CreateVolume.
	r.cfg.ClaimsFile = filepath.Join(r.claims, "claims.json") // under a regular file
	if c, err := New(r.cfg); err == nil {
		c.Close()
		t.Fatal("started with a claims file that cannot be written")
	}
}

func TestSecondControllerOnClaimsFileRefused(t *testing.T) {
	r := newRig(t, map[int]int64{1: 1 * gib})
	if c, err := New(r.cfg); err == nil {
		c.Close()
		t.Fatal("a second controller opened the claims file in use")
	} else if !strings.Contains(err.Error(), "held by another controller") {
		t.Fatalf("error %v", err)
	}
	r.c.Close()
	c, err := New(r.cfg)
	if err != nil {
		t.Fatalf("after Close the file is free: %v", err)
	}
	c.Close()
}

func TestNewRefusesCorruptClaims(t *testing.T) {
	r := newRig(t, map[int]int64{1: 1 * gib})
	r.c.Close()
	if err := os.WriteFile(r.claims, []byte(`{"version":1,"claims":[{"id":"x"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err := New(r.cfg); !errors.Is(err, ErrClaimsCorrupt) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("New on a corrupt claims file: %v, want ErrClaimsCorrupt", err)
	}
	// The lock was released on the way out: a fixed file opens.
	if err := os.Remove(r.claims); err != nil {
		t.Fatal(err)
	}
	r.open(t)
}

func TestClaimsKeptForLUNLeavingThePool(t *testing.T) {
	r := newRig(t, map[int]int64{1: 1 * gib, 2: 2 * gib})
	v := r.create(t, "a", 2*gib, 0, nil)
	r.c.Close()
	r.cfg.Pool = r.cfg.Pool[:1] // LUN 2 removed from the pool file
	c := r.open(t)
	if r.logs.FilterMessage("a claimed LUN is no longer in the pool file; the volume is kept").Len() != 1 {
		t.Error("no warning about the claim outside the pool")
	}
	if _, err := c.ValidateVolumeCapabilities(context.Background(), &csi.ValidateVolumeCapabilitiesRequest{
		VolumeId: v.GetVolumeId(), VolumeCapabilities: []*csi.VolumeCapability{blockCap()}}); err != nil {
		t.Fatalf("the volume is gone: %v", err)
	}
	if _, err := c.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	_, err := c.CreateVolume(context.Background(), createReq("b", 2*gib, 0, nil))
	wantCode(t, err, codes.OutOfRange) // LUN 2 is not handed out again
	// Nor erased: it may be someone else's now. It stays in the erasing list for a start that
	// has it in the pool again.
	waitLog(t, r.logs, "a LUN waiting to be erased is no longer in the pool file: it is neither erased nor handed out")
	if n := r.eraser.count(lunKey(2)); n != 0 {
		t.Errorf("a LUN outside the pool was erased %d times", n)
	}
	if st, err := ReadClaims(r.claims); err != nil || len(st.Erasing) != 1 || st.Erasing[0].LUN != lunKey(2) {
		t.Fatalf("claims file: %+v, %v; want LUN 2 erasing", st, err)
	}
}

func TestProbeFailureSkippedThenRetried(t *testing.T) {
	r := newRig(t, map[int]int64{1: 0, 2: 1 * gib})
	v := r.create(t, "a", 0, 0, nil)
	if v.GetVolumeContext()[ContextTarget] != lunURL(2) {
		t.Fatalf("got %s, want the LUN that answered", v.GetVolumeContext()[ContextTarget])
	}
	warn := r.logs.FilterMessage("skipping a pool LUN whose size cannot be read; it is probed again later")
	if warn.Len() != 1 || warn.All()[0].ContextMap()["lun"] != lunKey(1) || !strings.Contains(fmt.Sprint(warn.All()[0].ContextMap()["error"]), "portal unreachable") {
		t.Fatalf("the skip is not logged with the LUN and the reason: %+v", warn.All())
	}
	_, err := r.c.CreateVolume(context.Background(), createReq("b", 0, 0, nil))
	wantCode(t, err, codes.ResourceExhausted)
	if n := r.prober.count(lunKey(1)); n != 1 {
		t.Fatalf("LUN 1 probed %d times within the back-off, want 1", n)
	}
	r.prober.set(lunKey(1), 3*gib, nil) // the portal is back
	r.clock.advance(59 * time.Second)
	_, err = r.c.CreateVolume(context.Background(), createReq("b", 0, 0, nil))
	wantCode(t, err, codes.ResourceExhausted)
	r.clock.advance(time.Second)
	if v := r.create(t, "b", 0, 0, nil); v.GetCapacityBytes() != 3*gib {
		t.Fatalf("after the back-off: %+v", v)
	}
	if n := r.prober.count(lunKey(1)); n != 2 {
		t.Fatalf("LUN 1 probed %d times, want 2", n)
	}
}

func TestProbeCanceled(t *testing.T) {
	r := newRig(t, map[int]int64{1: 1 * gib})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := r.c.CreateVolume(ctx, createReq("a", 0, 0, nil))
	wantCode(t, err, codes.Canceled)
	if err := r.c.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r.c.sizes.get(lunKey(1)) != gib {
		t.Fatal("Probe did not read the size")
	}
}

func TestListVolumesPagination(t *testing.T) {
	sizes := map[int]int64{}
	for n := 1; n <= 8; n++ {
		sizes[n] = gib
	}
	r := newRig(t, sizes)
	ctx := context.Background()
	for i := range 5 {
		r.create(t, fmt.Sprintf("v%d", i), 0, 0, nil)
	}
	all := func(maxEntries int32) []string {
		var ids []string
		token := ""
		for {
			resp, err := r.c.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: maxEntries, StartingToken: token})
			if err != nil {
				t.Fatal(err)
			}
			if maxEntries > 0 && len(resp.GetEntries()) > int(maxEntries) {
				t.Fatalf("%d entries, max %d", len(resp.GetEntries()), maxEntries)
			}
			for _, e := range resp.GetEntries() {
				if e.GetVolume().GetCapacityBytes() != gib || e.GetVolume().GetVolumeContext()[ContextTarget] == "" {
					t.Fatalf("entry %+v", e)
				}
				ids = append(ids, e.GetVolume().GetVolumeId())
			}
			if token = resp.GetNextToken(); token == "" {
				return ids
			}
		}
	}
	whole := all(0)
	if len(whole) != 5 || !sort.StringsAreSorted(whole) {
		t.Fatalf("one page: %v", whole)
	}
	if paged := all(2); strings.Join(paged, ",") != strings.Join(whole, ",") {
		t.Fatalf("pages of 2: %v, want %v", paged, whole)
	}
	// Between pages: the last volume of the first page is deleted and another is created.
	first, err := r.c.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: 2})
	if err != nil || first.GetNextToken() == "" {
		t.Fatalf("first page: %v, %v", first, err)
	}
	if _, err := r.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: first.GetEntries()[1].GetVolume().GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	r.create(t, "late", 0, 0, nil)
	rest, err := r.c.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: first.GetNextToken()})
	if err != nil {
		t.Fatalf("the token of a deleted volume: %v", err)
	}
	seen := map[string]bool{first.GetEntries()[0].GetVolume().GetVolumeId(): true, first.GetEntries()[1].GetVolume().GetVolumeId(): true}
	for _, e := range rest.GetEntries() {
		if seen[e.GetVolume().GetVolumeId()] {
			t.Fatalf("the second page repeats %s", e.GetVolume().GetVolumeId())
		}
	}
	for _, id := range whole[2:] {
		found := false
		for _, e := range rest.GetEntries() {
			found = found || e.GetVolume().GetVolumeId() == id
		}
		if !found {
			t.Fatalf("volume %s, there throughout, is missing from the second page", id)
		}
	}
	_, err = r.c.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: "invalid-token"})
	wantCode(t, err, codes.Aborted)
	_, err = r.c.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: -1})
	wantCode(t, err, codes.InvalidArgument)
}

func TestGetCapacity(t *testing.T) {
	r := newRig(t, map[int]int64{1: 1 * gib, 2: 2 * gib, 3: 5 * gib, 100: 4 * gib, 4: 0})
	ctx := context.Background()
	capacity := func(q *csi.GetCapacityRequest) (int64, int64) {
		t.Helper()
		resp, err := r.c.GetCapacity(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAvailableCapacity(), resp.GetMaximumVolumeSize().GetValue()
	}
	if total, largest := capacity(&csi.GetCapacityRequest{}); total != 12*gib || largest != 5*gib {
		t.Fatalf("capacity %d, largest %d; want 12 GiB and 5 GiB (the unprobeable LUN counts for nothing)", total, largest)
	}
	r.create(t, "a", 5*gib, 0, nil)
	if total, largest := capacity(&csi.GetCapacityRequest{}); total != 7*gib || largest != 4*gib {
		t.Fatalf("after a claim: %d, %d", total, largest)
	}
	if total, largest := capacity(&csi.GetCapacityRequest{Parameters: map[string]string{"transport": "iscsi"}}); total != 3*gib || largest != 2*gib {
		t.Fatalf("iscsi only: %d, %d", total, largest)
	}
	if total, _ := capacity(&csi.GetCapacityRequest{VolumeCapabilities: []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)}}); total != 0 {
		t.Fatalf("capacity for a capability no volume has: %d", total)
	}
	if total, _ := capacity(&csi.GetCapacityRequest{VolumeCapabilities: []*csi.VolumeCapability{blockCap()}}); total != 7*gib {
		t.Fatalf("capacity for block volumes: %d", total)
	}
	_, err := r.c.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: map[string]string{"size": "big"}})
	wantCode(t, err, codes.InvalidArgument)
}

func TestValidateVolumeCapabilities(t *testing.T) {
	r := newRig(t, map[int]int64{1: 1 * gib})
	ctx := context.Background()
	v := r.create(t, "a", 0, 0, nil)
	caps := []*csi.VolumeCapability{blockCap(), mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY)}
	_, err := r.c.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeCapabilities: caps})
	wantCode(t, err, codes.InvalidArgument)
	_, err = r.c.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: v.GetVolumeId()})
	wantCode(t, err, codes.InvalidArgument)
	_, err = r.c.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "pool-00000000000000000000000000000000", VolumeCapabilities: caps})
	wantCode(t, err, codes.NotFound)
	resp, err := r.c.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: v.GetVolumeId(), VolumeCapabilities: caps})
	if err != nil || len(resp.GetConfirmed().GetVolumeCapabilities()) != 2 {
		t.Fatalf("supported capabilities: %v, %v", resp, err)
	}
	resp, err = r.c.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: v.GetVolumeId(),
		VolumeCapabilities: []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)}})
	if err != nil || resp.GetConfirmed() != nil || !strings.Contains(resp.GetMessage(), "one node at a time") {
		t.Fatalf("multi-node writer: %v, %v; want no confirmation and why", resp, err)
	}
	resp, err = r.c.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: v.GetVolumeId(),
		VolumeCapabilities: caps, Parameters: map[string]string{"cahce": "off"}})
	if err != nil || resp.GetConfirmed() != nil || resp.GetMessage() == "" {
		t.Fatalf("unknown parameter: %v, %v; want no confirmation", resp, err)
	}
}

func TestControllerGetCapabilities(t *testing.T) {
	r := newRig(t, map[int]int64{1: 1 * gib})
	resp, err := r.c.ControllerGetCapabilities(context.Background(), &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range resp.GetCapabilities() {
		got = append(got, c.GetRpc().GetType().String())
	}
	if strings.Join(got, " ") != "CREATE_DELETE_VOLUME LIST_VOLUMES GET_CAPACITY" {
		t.Fatalf("capabilities %v", got)
	}
}

func TestClaimsFileUnwritableChangesNothing(t *testing.T) {
	r := newRig(t, map[int]int64{1: 1 * gib, 2: 1 * gib})
	ctx := context.Background()
	v := r.create(t, "a", 0, 0, nil)
	dir := filepath.Dir(r.claims)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	_, err := r.c.CreateVolume(ctx, createReq("b", 0, 0, nil))
	wantCode(t, err, codes.Internal)
	_, err = r.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()})
	wantCode(t, err, codes.Internal)
	list, err := r.c.ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil || len(list.GetEntries()) != 1 || list.GetEntries()[0].GetVolume().GetVolumeId() != v.GetVolumeId() {
		t.Fatalf("after failed writes: %v, %v; want volume a alone", list, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if w := r.create(t, "b", 0, 0, nil); w.GetVolumeContext()[ContextTarget] == v.GetVolumeContext()[ContextTarget] {
		t.Fatal("the LUN of a was handed out again")
	}
	if st, err := ReadClaims(r.claims); err != nil || len(st.Claims) != 2 {
		t.Fatalf("claims file: %d, %v", len(st.Claims), err)
	}
}

func TestConcurrentCreates(t *testing.T) {
	const luns, callers = 5, 12
	sizes := map[int]int64{}
	for n := 1; n <= luns; n++ {
		sizes[n] = gib
	}
	r := newRig(t, sizes)
	var wg sync.WaitGroup
	var mu sync.Mutex
	targets := map[string]string{} // target → name
	exhausted := 0
	sameName := map[string]bool{}
	for i := range callers {
		wg.Add(2)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("v%d", i)
			resp, err := r.c.CreateVolume(context.Background(), createReq(name, 0, 0, nil))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				tgt := resp.GetVolume().GetVolumeContext()[ContextTarget]
				if other, dup := targets[tgt]; dup {
					t.Errorf("%s handed to %s and %s", tgt, other, name)
				}
				targets[tgt] = name
			case status.Code(err) == codes.ResourceExhausted:
				exhausted++
			default:
				t.Errorf("%s: %v", name, err)
			}
		}()
		go func() { // the same name from several callers at once is one volume
			defer wg.Done()
			resp, err := r.c.CreateVolume(context.Background(), createReq("shared", 0, 0, nil))
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				sameName[resp.GetVolume().GetVolumeId()] = true
			} else if status.Code(err) != codes.ResourceExhausted {
				t.Errorf("shared: %v", err)
			}
		}()
	}
	wg.Wait()
	list, err := r.c.ListVolumes(context.Background(), &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetEntries()) != luns || len(sameName) > 1 || len(targets)+len(sameName) != luns {
		t.Fatalf("%d volumes (%d named v*, %d IDs for shared), %d exhausted; want every LUN once",
			len(list.GetEntries()), len(targets), len(sameName), exhausted)
	}
	if st, err := ReadClaims(r.claims); err != nil || len(st.Claims) != luns {
		t.Fatalf("claims file: %d claims, %v", len(st.Claims), err)
	}
}
