package csipool

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc/codes"
)

// fakeEraser erases nothing: it counts calls by LUN key, fails while told to, and holds a LUN's
// erase at a gate (until the gate opens or ctx ends) when one is set.
type fakeEraser struct {
	mu      sync.Mutex
	calls   map[string]int
	failing map[string]bool
	gates   map[string]chan struct{}
	inside  map[string]int // erases running now
}

func newFakeEraser() *fakeEraser {
	return &fakeEraser{calls: map[string]int{}, failing: map[string]bool{}, gates: map[string]chan struct{}{}, inside: map[string]int{}}
}

func (e *fakeEraser) Erase(ctx context.Context, l LUN) (Erased, error) {
	e.mu.Lock()
	e.calls[l.Key]++
	e.inside[l.Key]++
	gate, fail := e.gates[l.Key], e.failing[l.Key]
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.inside[l.Key]--
		e.mu.Unlock()
	}()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return Erased{}, ctx.Err()
		}
	}
	if fail {
		return Erased{}, errors.New("portal unreachable")
	}
	return Erased{Method: "fake", Bytes: 1}, nil
}

func (e *fakeEraser) count(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[key]
}

func (e *fakeEraser) running(key string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.inside[key] > 0
}

// hold makes the LUN's erases wait; the returned func lets them go.
func (e *fakeEraser) hold(key string) (release func()) {
	gate := make(chan struct{})
	e.mu.Lock()
	e.gates[key] = gate
	e.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			e.mu.Lock()
			delete(e.gates, key)
			e.mu.Unlock()
			close(gate)
		})
	}
}

func (e *fakeEraser) setFailing(key string, fail bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.failing[key] = fail
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// erasingNow reports whether c holds the LUN in its erasing list.
func erasingNow(c *Controller, key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.erasing[key] != nil
}

// waitErased waits until c has freed the LUN after erasing it.
func waitErased(t *testing.T, c *Controller, key string) {
	t.Helper()
	waitFor(t, "LUN "+key+" erased", func() bool { return !erasingNow(c, key) })
}

// waitLog waits until a log line with the message was written.
func waitLog(t *testing.T, logs *observer.ObservedLogs, msg string) {
	t.Helper()
	waitFor(t, "the log line "+msg, func() bool { return logs.FilterMessage(msg).Len() > 0 })
}

// TestDeleteVolumeErasesBeforeFree: DeleteVolume answers at once with the LUN recorded as
// erasing; until the erase ends the LUN is in no volume list, no capacity and no CreateVolume
// answer (a request only it fits is ResourceExhausted), a repeated DeleteVolume is success and
// starts no second erase; once erased it is free and handed out again.
func TestDeleteVolumeErasesBeforeFree(t *testing.T) {
	r := newRig(t, map[int]int64{1: 1 * gib, 2: 2 * gib})
	ctx := context.Background()
	release := r.eraser.hold(lunKey(1))
	defer release()
	v := r.create(t, "a", 0, 0, nil)
	if v.GetVolumeContext()[ContextTarget] != lunURL(1) {
		t.Fatalf("got %s, want LUN 1", v.GetVolumeContext()[ContextTarget])
	}
	if _, err := r.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	st, err := ReadClaims(r.claims)
	if err != nil || len(st.Claims) != 0 || len(st.Erasing) != 1 ||
		st.Erasing[0].LUN != lunKey(1) || st.Erasing[0].VolumeID != v.GetVolumeId() || st.Erasing[0].Size != gib {
		t.Fatalf("claims file after the delete: %+v, %v; want LUN 1 erasing", st, err)
	}
	waitFor(t, "the erase to start", func() bool { return r.eraser.running(lunKey(1)) })

	if list, err := r.c.ListVolumes(ctx, &csi.ListVolumesRequest{}); err != nil || len(list.GetEntries()) != 0 {
		t.Fatalf("ListVolumes during the erase: %v, %v; want none", list, err)
	}
	capacity, err := r.c.GetCapacity(ctx, &csi.GetCapacityRequest{})
	if err != nil || capacity.GetAvailableCapacity() != 2*gib || capacity.GetMaximumVolumeSize().GetValue() != 2*gib {
		t.Fatalf("GetCapacity during the erase: %v, %v; want LUN 2 alone", capacity, err)
	}
	// only LUN 1 fits, and it is being erased: CreateVolume waits for the erase, here until its
	// deadline
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = r.c.CreateVolume(short, createReq("b", 0, gib, nil))
	cancel()
	wantCode(t, err, codes.ResourceExhausted)
	if !strings.Contains(err.Error(), "1 being erased") {
		t.Errorf("the answer does not say a LUN is being erased: %v", err)
	}
	if w := r.create(t, "c", 0, 0, nil); w.GetVolumeContext()[ContextTarget] != lunURL(2) {
		t.Fatalf("during the erase CreateVolume handed out %s, want LUN 2", w.GetVolumeContext()[ContextTarget])
	}
	for range 2 { // csi-provisioner's retries
		if _, err := r.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
			t.Fatalf("DeleteVolume of a volume being erased: %v", err)
		}
	}
	if st, err := ReadClaims(r.claims); err != nil || len(st.Erasing) != 1 {
		t.Fatalf("after the retries: %+v, %v", st, err)
	}

	release()
	waitErased(t, r.c, lunKey(1))
	if n := r.eraser.count(lunKey(1)); n != 1 {
		t.Errorf("LUN 1 erased %d times, want once", n)
	}
	if r.logs.FilterMessage("LUN erased; it is free").Len() != 1 {
		t.Errorf("the end of the erase is not logged: %v", r.logs.All())
	}
	if st, err := ReadClaims(r.claims); err != nil || len(st.Erasing) != 0 {
		t.Fatalf("claims file after the erase: %+v, %v", st, err)
	}
	if w := r.create(t, "b", 0, gib, nil); w.GetVolumeContext()[ContextTarget] != lunURL(1) || w.GetVolumeId() == v.GetVolumeId() {
		t.Fatalf("after the erase: %+v, want LUN 1 under a new ID", w)
	}
	if n := r.prober.count(lunKey(1)); n != 1 {
		t.Errorf("LUN 1 probed %d times; an erased LUN's size is known", n)
	}
}

// TestEraseFailureRetried: an erase that fails is logged and tried again with a back-off; the
// LUN stays out of the pool, in memory and in the file, until one succeeds.
func TestEraseFailureRetried(t *testing.T) {
	r := newRig(t, map[int]int64{1: 1 * gib})
	ctx := context.Background()
	r.eraser.setFailing(lunKey(1), true)
	v := r.create(t, "a", 0, 0, nil)
	if _, err := r.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	const failed = "erasing a returned LUN failed; it stays out of the pool and is tried again"
	waitFor(t, "three failed erases", func() bool { return r.logs.FilterMessage(failed).Len() >= 3 })
	_, err := r.c.CreateVolume(ctx, createReq("b", 0, 0, nil))
	wantCode(t, err, codes.ResourceExhausted)
	if st, err := ReadClaims(r.claims); err != nil || len(st.Erasing) != 1 {
		t.Fatalf("claims file while the erase fails: %+v, %v", st, err)
	}
	lines := r.logs.FilterMessage(failed).All()
	first, third := lines[0].ContextMap(), lines[2].ContextMap()
	if first["lun"] != lunKey(1) || !strings.Contains(first["error"].(string), "portal unreachable") ||
		third["retry_in"].(time.Duration) <= first["retry_in"].(time.Duration) {
		t.Errorf("the failures are not logged with the LUN, the error and a growing back-off: %v, %v", first, third)
	}
	r.eraser.setFailing(lunKey(1), false) // the target is back
	waitErased(t, r.c, lunKey(1))
	if w := r.create(t, "b", 0, 0, nil); w.GetVolumeContext()[ContextTarget] != lunURL(1) {
		t.Fatalf("after the erase: %+v", w)
	}
}

// TestEraseResumesAfterRestart: a controller stopped mid-erase leaves the LUN erasing in the
// claims file; the next start erases it again before handing it out.
func TestEraseResumesAfterRestart(t *testing.T) {
	r := newRig(t, map[int]int64{1: 1 * gib})
	ctx := context.Background()
	release := r.eraser.hold(lunKey(1))
	v := r.create(t, "a", 0, 0, nil)
	if _, err := r.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the erase to start", func() bool { return r.eraser.running(lunKey(1)) })
	if err := r.c.Close(); err != nil { // returns with the erase interrupted, not finished
		t.Fatal(err)
	}
	if r.eraser.running(lunKey(1)) {
		t.Fatal("Close returned with the erase still running")
	}
	if r.logs.FilterMessage("erase interrupted by the controller's stop; the LUN stays out of the pool and is erased at the next start").Len() != 1 {
		t.Error("the interrupted erase is not logged")
	}
	if st, err := ReadClaims(r.claims); err != nil || len(st.Erasing) != 1 {
		t.Fatalf("claims file after the stop: %+v, %v; want LUN 1 erasing", st, err)
	}
	c := r.open(t) // held again: the erase waits, and the LUN with it
	waitFor(t, "the erase to start again", func() bool { return r.eraser.count(lunKey(1)) == 2 })
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond) // CreateVolume waits for the erase
	_, err := c.CreateVolume(short, createReq("b", 0, 0, nil))
	cancel()
	wantCode(t, err, codes.ResourceExhausted)
	release()
	waitErased(t, c, lunKey(1))
	resp, err := c.CreateVolume(ctx, createReq("b", 0, 0, nil))
	if err != nil || resp.GetVolume().GetVolumeContext()[ContextTarget] != lunURL(1) {
		t.Fatalf("after the resumed erase: %v, %v", resp, err)
	}
}

// TestEraseNotRecordedIsRetried: an erase that succeeded but whose end could not be written to
// the claims file leaves the LUN erasing (memory as the file says) and is done again.
func TestEraseNotRecordedIsRetried(t *testing.T) {
	r := newRig(t, map[int]int64{1: 1 * gib})
	ctx := context.Background()
	release := r.eraser.hold(lunKey(1))
	v := r.create(t, "a", 0, 0, nil)
	if _, err := r.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(r.claims)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	release()
	waitLog(t, r.logs, "erasing a returned LUN failed; it stays out of the pool and is tried again")
	if !erasingNow(r.c, lunKey(1)) {
		t.Fatal("the LUN was freed although the claims file could not say so")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	waitErased(t, r.c, lunKey(1))
	if st, err := ReadClaims(r.claims); err != nil || len(st.Erasing) != 0 {
		t.Fatalf("claims file: %+v, %v", st, err)
	}
	if n := r.eraser.count(lunKey(1)); n < 2 {
		t.Errorf("erased %d times, want again after the failed write", n)
	}
}

// TestNoErase: without an eraser the controller does not start unless told NoErase; with NoErase
// a deleted volume's LUN is free at once, and LUNs left mid-erase are freed at start with a
// warning.
func TestNoErase(t *testing.T) {
	r := newRig(t, map[int]int64{1: 1 * gib})
	ctx := context.Background()
	release := r.eraser.hold(lunKey(1))
	defer release()
	v := r.create(t, "a", 0, 0, nil)
	if _, err := r.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the erase to start", func() bool { return r.eraser.running(lunKey(1)) })
	r.c.Close()
	r.cfg.Eraser = nil
	if c, err := New(r.cfg); err == nil || !strings.Contains(err.Error(), "no Eraser") {
		if c != nil {
			c.Close()
		}
		t.Fatalf("started without an Eraser nor NoErase: %v", err)
	}
	r.cfg.NoErase = true
	c := r.open(t)
	if r.logs.FilterMessage("erasing is off: a LUN left mid-erase by an earlier start is free again, unerased").Len() != 1 {
		t.Error("freeing the LUN left mid-erase is not logged")
	}
	if st, err := ReadClaims(r.claims); err != nil || len(st.Erasing) != 0 {
		t.Fatalf("claims file: %+v, %v", st, err)
	}
	for _, name := range []string{"b", "c"} { // free at once after each delete
		resp, err := c.CreateVolume(ctx, createReq(name, 0, 0, nil))
		if err != nil || resp.GetVolume().GetVolumeContext()[ContextTarget] != lunURL(1) {
			t.Fatalf("%s: %v, %v", name, resp, err)
		}
		if _, err := c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.eraser.count(lunKey(1)); n != 1 {
		t.Errorf("erases: %d, want only the one before NoErase", n)
	}
}

// TestCreateVolumeWaitsForErase: when only a LUN being erased fits, CreateVolume waits for the
// erase and then hands that LUN out (csi-sanity creates right after deleting; a CO would retry).
func TestCreateVolumeWaitsForErase(t *testing.T) {
	r := newRig(t, map[int]int64{1: 1 * gib})
	ctx := context.Background()
	release := r.eraser.hold(lunKey(1))
	v := r.create(t, "a", 0, 0, nil)
	if _, err := r.c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the erase to start", func() bool { return r.eraser.running(lunKey(1)) })
	type result struct {
		resp *csi.CreateVolumeResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := r.c.CreateVolume(ctx, createReq("b", 0, 0, nil))
		done <- result{resp, err}
	}()
	waitFor(t, "CreateVolume to wait", func() bool {
		select {
		case res := <-done:
			t.Fatalf("CreateVolume answered during the erase: %v, %v", res.resp, res.err)
		default:
		}
		return r.eraser.running(lunKey(1))
	})
	release()
	res := <-done
	if res.err != nil || res.resp.GetVolume().GetVolumeContext()[ContextTarget] != lunURL(1) {
		t.Fatalf("after the erase: %v, %v; want LUN 1", res.resp, res.err)
	}
	if n := r.eraser.count(lunKey(1)); n != 1 {
		t.Errorf("LUN 1 erased %d times, want once", n)
	}
}
