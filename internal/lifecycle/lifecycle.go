// Package lifecycle is the one state machine of a running gateway (docs/operations.md):
//
//	starting → ready → draining → flushing → stopped
//
// with recovering (taking over a device a previous gateway left), restarting (a planned
// restart's hand-over; back to ready if it fails) and failed (I/O answered with EIO, reason
// recorded; back to ready when its cause goes away, e.g. a path to the target returns) beside
// them.
//
// A shutdown is committed once nothing can bring the gateway back to serving: CommitTo marks
// the transition (sd_notify's STOPPING=1 is sent then, not when a detach that may still fail
// begins), and from then on ready, recovering and restarting are refused. Signals, the control socket's detach, restart and systemd all drive the
// same Machine, and everything that reports the state (status, metrics, sd_notify, a detach's
// progress lines) observes it instead of keeping its own copy.
//
// Invariants: a transition not in the table is refused with an error and changes nothing;
// observers see every transition in order, each exactly once, and are called outside the
// Machine's lock, so an observer may read the Machine.
package lifecycle

import (
	"fmt"
	"sync"
	"time"
)

// State is a gateway's lifecycle state; its string is the stable name status and metrics show.
type State string

// The states. Their strings are part of the status schema (version 1).
const (
	Starting   State = "starting"
	Ready      State = "ready"
	Recovering State = "recovering"
	Restarting State = "restarting"
	Draining   State = "draining"
	Flushing   State = "flushing"
	Stopped    State = "stopped"
	Failed     State = "failed"
)

// States lists every state, in the order documentation and metrics enumerate them.
var States = []State{Starting, Ready, Recovering, Restarting, Draining, Flushing, Stopped, Failed}

// next holds the allowed transitions. Ready goes to flushing for a detach's write-back while
// the device still serves, and flushing to draining once that detach commits. Draining,
// flushing and restarting may return to ready: a detach, stop or restart whose write-back
// failed keeps the gateway serving with its data. Failed may return to ready too: a gateway
// that failed because no path reached the target serves again once one is back. Failed goes to
// flushing for a detach's write-back as ready does: the operator's detach tries it even with no
// path (one may be back by then), and a write-back that fails returns to failed, or to ready if a
// path came back meanwhile.
var next = map[State][]State{
	Starting:   {Ready, Recovering, Failed, Draining, Stopped},
	Recovering: {Ready, Failed, Draining},
	Ready:      {Draining, Flushing, Recovering, Restarting, Failed},
	Restarting: {Ready, Failed, Draining},
	Draining:   {Flushing, Stopped, Ready, Failed},
	Flushing:   {Draining, Stopped, Ready, Failed},
	Failed:     {Ready, Draining, Flushing, Stopped},
	Stopped:    nil,
}

// serving are the states a committed shutdown never returns to.
var serving = map[State]bool{Ready: true, Recovering: true, Restarting: true}

// Transition is one change of state.
type Transition struct {
	From, To State
	Reason   string // why; for failed, the error; may be empty
	At       time.Time
	// Committed is set on the transition that committed a shutdown (CommitTo): the gateway
	// will not serve again.
	Committed bool
}

// FlushProgress is where a shutdown or detach write-back stands.
type FlushProgress struct {
	DirtyBytes       uint64 // still to write back
	WrittenBackBytes uint64 // written back since the flush began
}

// Observer is told about every transition and every flush progress report.
type Observer interface {
	StateChanged(Transition)
	FlushProgressed(FlushProgress)
}

// Machine is a gateway's lifecycle. The zero value is not usable; call New.
type Machine struct {
	mu        sync.Mutex
	state     State
	reason    string
	since     time.Time
	started   time.Time
	committed bool
	observers map[int]Observer
	nextID    int
	// notify serializes observer calls so they see transitions in order even though they run
	// outside mu.
	notify sync.Mutex
}

// New returns a Machine in Starting.
func New() *Machine {
	now := time.Now()
	return &Machine{state: Starting, since: now, started: now, observers: map[int]Observer{}}
}

// State returns the current state and the reason given when it was entered.
func (m *Machine) State() (State, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state, m.reason
}

// Started is when the Machine was created: the gateway's start time for uptime.
func (m *Machine) Started() time.Time { return m.started }

// To moves the Machine to s. A transition the table does not allow returns an error and changes
// nothing; moving to the current state is a no-op (no observer call), so repeated signals are
// harmless.
func (m *Machine) To(s State, reason string) error {
	_, err := m.ToIf(nil, s, reason)
	return err
}

// ToIf is To only if cond (nil: always) holds for the current state and its reason, checked
// under the same lock as the move: a condition such as "still ready" cannot be overtaken by a
// concurrent shutdown. moved reports whether the state changed.
func (m *Machine) ToIf(cond func(State, string) bool, s State, reason string) (moved bool, err error) {
	return m.move(cond, s, reason, false)
}

// CommitTo moves the Machine to s and commits the shutdown: from now on it never serves again
// (ready, recovering and restarting are refused). Observers see this one transition with
// Committed set. When the shutdown is already committed it is To; when the Machine is in s
// already, the commit still happens and is announced as a transition from s to s.
func (m *Machine) CommitTo(s State, reason string) error {
	_, err := m.move(nil, s, reason, true)
	return err
}

// Committed reports whether a shutdown is committed.
func (m *Machine) Committed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.committed
}

func (m *Machine) move(cond func(State, string) bool, s State, reason string, commit bool) (bool, error) {
	m.notify.Lock()
	defer m.notify.Unlock()
	m.mu.Lock()
	from := m.state
	commit = commit && !m.committed
	switch {
	case cond != nil && !cond(from, m.reason):
		m.mu.Unlock()
		return false, nil
	case from == s && !commit:
		m.mu.Unlock()
		return false, nil
	case from != s && !allowed(from, s), m.committed && serving[s]:
		committed := m.committed
		m.mu.Unlock()
		if committed && serving[s] {
			return false, fmt.Errorf("lifecycle: %s → %s refused: the shutdown is committed", from, s)
		}
		return false, fmt.Errorf("lifecycle: %s → %s is not a valid transition", from, s)
	}
	t := Transition{From: from, To: s, Reason: reason, At: time.Now(), Committed: commit}
	m.state, m.reason, m.since = s, reason, t.At
	m.committed = m.committed || commit
	obs := m.snapshotObservers()
	m.mu.Unlock()
	for _, o := range obs {
		o.StateChanged(t)
	}
	return from != s || commit, nil
}

// ReportFlush tells observers how a write-back is progressing (sd_notify extends the stop
// timeout with it; a detach streams it to the operator's terminal).
func (m *Machine) ReportFlush(p FlushProgress) {
	m.notify.Lock()
	defer m.notify.Unlock()
	m.mu.Lock()
	obs := m.snapshotObservers()
	m.mu.Unlock()
	for _, o := range obs {
		o.FlushProgressed(p)
	}
}

// Subscribe adds o and returns the function that removes it.
func (m *Machine) Subscribe(o Observer) (cancel func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	id := m.nextID
	m.nextID++
	m.observers[id] = o
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(m.observers, id)
	}
}

func (m *Machine) snapshotObservers() []Observer {
	obs := make([]Observer, 0, len(m.observers))
	for id := 0; id < m.nextID; id++ { // subscription order
		if o, ok := m.observers[id]; ok {
			obs = append(obs, o)
		}
	}
	return obs
}

func allowed(from, to State) bool {
	for _, s := range next[from] {
		if s == to {
			return true
		}
	}
	return false
}
