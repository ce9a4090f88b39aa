package statefile

import (
	"fmt"

	"github.com/iser-blk/iser-blk/internal/modes"
)

// CheckIdentity reports, as ErrForeign, a state file written for another LUN than now: the
// device it names holds a filesystem of that LUN, and serving another LUN's blocks under it would
// corrupt both. A DeviceID is compared only when both sides have one.
func (s State) CheckIdentity(now Identity) error {
	was := s.LUN
	switch {
	case was.Target != now.Target || was.LUN != now.LUN:
		return fmt.Errorf("%w: it names %s LUN %d, this gateway serves %s LUN %d", ErrForeign, was.Target, was.LUN, now.Target, now.LUN)
	case was.DeviceID != "" && now.DeviceID != "" && was.DeviceID != now.DeviceID:
		return fmt.Errorf("%w: device identifier %s, the LUN now reports %s", ErrForeign, was.DeviceID, now.DeviceID)
	case was.Size != now.Size || was.BlockSize != now.BlockSize:
		return fmt.Errorf("%w: it names %d bytes in %d-byte blocks, the LUN now has %d in %d-byte blocks", ErrForeign, was.Size, was.BlockSize, now.Size, now.BlockSize)
	}
	return nil
}

// Resumable is the safety rule: a device may be handed to a successor unless its state is Dirty
// — a predecessor ran a write-back cache and did not record that everything was flushed. Then
// writes it acknowledged may be lost, and a filesystem that goes on would later send a FLUSH and
// believe them durable. why says so in words for the log and status.
//
// The rule looks at Dirty alone, not at CacheMode: a successor that took a fenced device over
// with another cache mode records its own mode and keeps Dirty (the fence passes on), and its
// own successor must fence the device too. Fresh never marks another mode dirty.
func (s State) Resumable() (ok bool, why string) {
	const next = "they may be lost, so the device fails every I/O instead of resuming. Unmount the filesystem, detach (SIGTERM this gateway), attach afresh and run fsck"
	switch {
	case s.Dirty && s.CacheMode == modes.WriteBack:
		return false, fmt.Sprintf("gateway (pid %d) ended without a planned shutdown while its write-back cache could hold acknowledged writes not yet on the target: %s", s.PID, next)
	case s.Dirty:
		return false, fmt.Sprintf("gateway (pid %d, cache %s) served a device already fenced: an earlier gateway's write-back cache could have held acknowledged writes not yet on the target: %s", s.PID, s.CacheMode, next)
	}
	return true, ""
}

// Fresh is the state a gateway records before its device serves its first request: clean, as
// nothing is acknowledged yet (internal/gate records Dirty before the first write it lets
// through to a write-back cache).
func Fresh(name string, kind modes.Frontend, devID int, id Identity, cacheMode modes.Cache, pid int) State {
	return State{Version: Version, Name: name, Kind: kind, DevID: devID, LUN: id, CacheMode: cacheMode, PID: pid}
}
