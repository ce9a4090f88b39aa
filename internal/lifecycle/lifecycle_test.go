package lifecycle

import (
	"reflect"
	"strings"
	"testing"
)

type recorder struct {
	transitions []Transition
	progress    []FlushProgress
}

func (r *recorder) StateChanged(t Transition)       { r.transitions = append(r.transitions, t) }
func (r *recorder) FlushProgressed(p FlushProgress) { r.progress = append(r.progress, p) }

func TestMachineWalksTheDetachPath(t *testing.T) {
	m := New()
	var r recorder
	m.Subscribe(&r)
	for _, s := range []State{Ready, Draining, Flushing} {
		if err := m.To(s, ""); err != nil {
			t.Fatal(err)
		}
	}
	m.ReportFlush(FlushProgress{DirtyBytes: 10, WrittenBackBytes: 5})
	if err := m.To(Stopped, "detached"); err != nil {
		t.Fatal(err)
	}
	var got []State
	for _, tr := range r.transitions {
		got = append(got, tr.To)
	}
	if want := []State{Ready, Draining, Flushing, Stopped}; !reflect.DeepEqual(got, want) {
		t.Fatalf("observed %v, want %v", got, want)
	}
	if len(r.progress) != 1 || r.progress[0].WrittenBackBytes != 5 {
		t.Fatalf("progress %+v", r.progress)
	}
	if s, reason := m.State(); s != Stopped || reason != "detached" {
		t.Fatalf("state %s %q", s, reason)
	}
}

func TestMachineRefusesInvalidTransitions(t *testing.T) {
	m := New()
	var r recorder
	m.Subscribe(&r)
	if err := m.To(Flushing, ""); err == nil {
		t.Fatal("starting → flushing accepted")
	}
	if s, _ := m.State(); s != Starting {
		t.Fatalf("state changed to %s by a refused transition", s)
	}
	_ = m.To(Ready, "")
	_ = m.To(Draining, "")
	_ = m.To(Stopped, "")
	if err := m.To(Ready, ""); err == nil {
		t.Fatal("stopped → ready accepted")
	}
	if len(r.transitions) != 3 {
		t.Fatalf("observer saw %d transitions, want 3", len(r.transitions))
	}
}

func TestSameStateIsANoOp(t *testing.T) {
	m := New()
	var r recorder
	m.Subscribe(&r)
	if err := m.To(Starting, ""); err != nil {
		t.Fatal(err)
	}
	if len(r.transitions) != 0 {
		t.Fatalf("no-op transition observed: %+v", r.transitions)
	}
}

func TestFailedWriteBackReturnsToReady(t *testing.T) {
	m := New()
	for _, s := range []State{Ready, Draining, Flushing, Ready} {
		if err := m.To(s, ""); err != nil {
			t.Fatalf("→ %s: %v", s, err)
		}
	}
}

func TestUnsubscribeStopsNotifications(t *testing.T) {
	m := New()
	var a, b recorder
	cancel := m.Subscribe(&a)
	m.Subscribe(&b)
	cancel()
	_ = m.To(Ready, "")
	if len(a.transitions) != 0 || len(b.transitions) != 1 {
		t.Fatalf("a saw %d, b saw %d", len(a.transitions), len(b.transitions))
	}
}

func TestEveryStateHasATableEntry(t *testing.T) {
	for _, s := range States {
		if _, ok := next[s]; !ok {
			t.Errorf("state %s missing from the transition table", s)
		}
	}
}

// TestToIfChecksUnderTheLock: a conditional move happens only while its condition holds, and a
// gateway that failed for want of a path returns to ready while one that was stopped meanwhile
// does not.
func TestToIfChecksUnderTheLock(t *testing.T) {
	m := New()
	var r recorder
	m.Subscribe(&r)
	_ = m.To(Ready, "")
	isReady := func(s State, _ string) bool { return s == Ready }
	if moved, err := m.ToIf(isReady, Failed, "no path"); !moved || err != nil {
		t.Fatalf("ready → failed: moved %v, %v", moved, err)
	}
	if moved, _ := m.ToIf(isReady, Failed, "again"); moved {
		t.Fatal("a move whose condition no longer held happened")
	}
	failedForNoPath := func(s State, reason string) bool { return s == Failed && reason == "no path" }
	if moved, err := m.ToIf(failedForNoPath, Ready, "path back"); !moved || err != nil {
		t.Fatalf("failed → ready: moved %v, %v", moved, err)
	}
	_ = m.To(Draining, "detach")
	if moved, _ := m.ToIf(isReady, Failed, "no path"); moved {
		t.Fatal("a draining gateway was marked failed by a condition on ready")
	}
	if s, reason := m.State(); s != Draining || reason != "detach" {
		t.Fatalf("state %s %q, want draining", s, reason)
	}
	if len(r.transitions) != 4 {
		t.Fatalf("observer saw %d transitions, want 4", len(r.transitions))
	}
}

func TestCommitToIsAnnouncedOnceAndNeverServesAgain(t *testing.T) {
	m := New()
	var r recorder
	m.Subscribe(&r)
	for _, s := range []State{Ready, Flushing} {
		if err := m.To(s, ""); err != nil {
			t.Fatal(err)
		}
	}
	if m.Committed() {
		t.Fatal("committed before CommitTo")
	}
	if err := m.CommitTo(Draining, "detach committed"); err != nil {
		t.Fatal(err)
	}
	if err := m.CommitTo(Draining, "again"); err != nil {
		t.Fatal(err)
	}
	if err := m.To(Ready, "write-back failed"); err == nil || !strings.Contains(err.Error(), "committed") {
		t.Fatalf("ready after the commit: %v, want refused", err)
	}
	if err := m.To(Flushing, "final flush"); err != nil {
		t.Fatal(err)
	}
	var commits int
	for _, tr := range r.transitions {
		if tr.Committed {
			commits++
			if tr.From != Flushing || tr.To != Draining {
				t.Errorf("commit announced as %s → %s", tr.From, tr.To)
			}
		}
	}
	if commits != 1 || !m.Committed() {
		t.Fatalf("%d committed transitions in %+v, want 1", commits, r.transitions)
	}
}

func TestCommitInPlaceIsAnnounced(t *testing.T) {
	m := New()
	var r recorder
	m.Subscribe(&r)
	_ = m.To(Ready, "")
	_ = m.To(Draining, "stop: closing the gate")
	if err := m.CommitTo(Draining, "stop committed"); err != nil {
		t.Fatal(err)
	}
	if last := r.transitions[len(r.transitions)-1]; !last.Committed || last.From != Draining || last.To != Draining {
		t.Fatalf("last transition %+v, want a committed draining → draining", last)
	}
}
