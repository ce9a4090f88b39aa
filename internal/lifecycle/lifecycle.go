// Package lifecycle is the one state machine of a running gateway (docs/operations.md):
//
//	starting → ready → draining → flushing → stopped
//
// with recovering (re-attaching after a restart) and failed (I/O answered with EIO, reason
// recorded; back to ready when its cause goes away, e.g. a path to the target returns) beside
// them. Signals, the control socket's detach, restart and systemd all drive the
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
	Draining   State = "draining"
	Flushing   State = "flushing"
	Stopped    State = "stopped"
	Failed     State = "failed"
)

// States lists every state, in the order documentation and metrics enumerate them.
var States = []State{Starting, Ready, Recovering, Draining, Flushing, Stopped, Failed}

// next holds the allowed transitions. Draining and flushing may return to ready: a detach
// refused after draining began, or a write-back that failed, keeps the gateway serving with its
// data (issue 16: "a write-back that fails keeps the data and the gateway running"). Failed may
// return to ready too: a gateway that failed because no path reached the target serves again
// once one is back.
var next = map[State][]State{
	Starting:   {Ready, Recovering, Failed, Draining, Stopped},
	Recovering: {Ready, Failed, Draining},
	Ready:      {Draining, Recovering, Failed},
	Draining:   {Flushing, Stopped, Ready, Failed},
	Flushing:   {Stopped, Ready, Failed},
	Failed:     {Ready, Draining, Stopped},
	Stopped:    nil,
}

// Transition is one change of state.
type Transition struct {
	From, To State
	Reason   string // why; for failed, the error; may be empty
	At       time.Time
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
	m.notify.Lock()
	defer m.notify.Unlock()
	m.mu.Lock()
	from := m.state
	if from == s || (cond != nil && !cond(from, m.reason)) {
		m.mu.Unlock()
		return false, nil
	}
	if !allowed(from, s) {
		m.mu.Unlock()
		return false, fmt.Errorf("lifecycle: %s → %s is not a valid transition", from, s)
	}
	t := Transition{From: from, To: s, Reason: reason, At: time.Now()}
	m.state, m.reason, m.since = s, reason, t.At
	obs := m.snapshotObservers()
	m.mu.Unlock()
	for _, o := range obs {
		o.StateChanged(t)
	}
	return true, nil
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
