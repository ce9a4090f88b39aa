// Package sdnotify tells systemd about a gateway's lifecycle (sd_notify(3), Type=notify units):
// READY=1 when the lifecycle reaches ready (again after a planned restart or a detach or restart
// that failed), STATUS= on every state change, RELOADING=1 with MONOTONIC_USEC when a planned
// restart begins, STOPPING=1 only on the transition that commits a shutdown, EXTEND_TIMEOUT_USEC while a shutdown write-back makes progress, and
// WATCHDOG=1 pings when the unit sets WatchdogSec. It uses github.com/coreos/go-systemd/v22's
// daemon package for the socket protocol. FDStore (fdstore.go) is the unit's file descriptor
// store, which keeps a kernel NBD device's sockets across a stop --keep.
//
// Why STOPPING=1 waits for the commit: systemd (src/core/service.c) remembers it, and once the
// reload or detach that sent it ends, it puts the unit in stop-sigterm, ignores a later READY=1
// and kills the process when TimeoutStopSec passes. A detach whose write-back fails, or a
// restart, returns to serving; only a committed shutdown never does.
//
// A Notifier is a lifecycle.Observer: subscribe it and the gateway never calls sd_notify
// itself. Without NOTIFY_SOCKET (not started by systemd) every call is a no-op. Errors are
// logged, never returned to the lifecycle: systemd's view must not decide whether I/O goes on.
package sdnotify

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/dustin/go-humanize"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/internal/lifecycle"
)

// DefaultExtendBy is how much more stop time each flush progress report asks systemd for.
const DefaultExtendBy = 30 * time.Second

// Notifier sends lifecycle changes to systemd.
type Notifier struct {
	log      *zap.Logger
	extendBy time.Duration

	mu          sync.Mutex
	lastWritten uint64 // WrittenBackBytes of the last progress that extended the timeout
}

// New returns a Notifier. extendBy ≤ 0 means DefaultExtendBy.
func New(log *zap.Logger, extendBy time.Duration) *Notifier {
	if log == nil {
		log = zap.NewNop()
	}
	if extendBy <= 0 {
		extendBy = DefaultExtendBy
	}
	return &Notifier{log: log, extendBy: extendBy}
}

// Send sends the given assignments ("READY=1", "STATUS=…") in one datagram. It reports whether
// a NOTIFY_SOCKET was there to send to.
func (n *Notifier) Send(assignments ...string) (bool, error) {
	return daemon.SdNotify(false, strings.Join(assignments, "\n"))
}

// StateChanged implements lifecycle.Observer.
func (n *Notifier) StateChanged(t lifecycle.Transition) {
	status := "STATUS=" + string(t.To)
	if t.Reason != "" {
		status += ": " + t.Reason
	}
	msg := []string{status}
	switch {
	case t.Committed:
		msg = append([]string{daemon.SdNotifyStopping}, msg...)
	case t.To == lifecycle.Ready:
		msg = append([]string{daemon.SdNotifyReady}, msg...)
	case t.To == lifecycle.Restarting:
		// MONOTONIC_USEC lets systemd (253+, Type=notify-reload) tell this reload from an
		// older one; 252 ignores it.
		msg = append([]string{daemon.SdNotifyReloading, fmt.Sprintf("MONOTONIC_USEC=%d", monotonicUsec())}, msg...)
	}
	if t.To == lifecycle.Flushing {
		n.mu.Lock()
		n.lastWritten = 0
		n.mu.Unlock()
	}
	n.send(msg...)
}

// FlushProgressed implements lifecycle.Observer: the stop timeout is extended only when bytes
// were written back since the last report, so a stuck write-back still times out.
func (n *Notifier) FlushProgressed(p lifecycle.FlushProgress) {
	msg := []string{fmt.Sprintf("STATUS=flushing: %s dirty, %s written back",
		humanize.IBytes(p.DirtyBytes), humanize.IBytes(p.WrittenBackBytes))}
	n.mu.Lock()
	if p.WrittenBackBytes > n.lastWritten {
		n.lastWritten = p.WrittenBackBytes
		msg = append(msg, fmt.Sprintf("EXTEND_TIMEOUT_USEC=%d", n.extendBy.Microseconds()))
	}
	n.mu.Unlock()
	n.send(msg...)
}

func (n *Notifier) send(msg ...string) {
	if _, err := n.Send(msg...); err != nil {
		n.log.Warn("sd_notify failed", zap.Strings("message", msg), zap.Error(err))
	}
}

// RunWatchdog sends WATCHDOG=1 at half the unit's WatchdogSec until ctx ends, skipping a ping
// when healthy (if non-nil) says no, so that systemd restarts a gateway that stopped making
// progress. It returns at once when the watchdog is not enabled for this process.
func (n *Notifier) RunWatchdog(ctx context.Context, healthy func() bool) error {
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil || interval <= 0 {
		return err
	}
	tick := time.NewTicker(interval / 2)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if healthy == nil || healthy() {
				n.send(daemon.SdNotifyWatchdog)
			}
		}
	}
}

// monotonicUsec is CLOCK_MONOTONIC in microseconds, as sd_notify(3)'s MONOTONIC_USEC wants.
func monotonicUsec() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano() / 1e3
}
