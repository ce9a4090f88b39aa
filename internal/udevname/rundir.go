package udevname

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/statefile"
)

// maxStateBytes is more than statefile.Decode accepts, so an oversized file is refused there
// after reading no more than this.
const maxStateBytes = 64<<10 + 1

// lookupUblk finds the state file naming /dev/ublkbID. Several can (a gateway that died leaves
// its file, and the driver may give its number to the next device): a file whose gateway is
// alive wins, then the newest, which is the one written just before START_DEV announced the
// device. Files that are not a valid state of a valid name are skipped and reported to warn.
func lookupUblk(dir string, id int, warn func(error)) (Device, bool, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return Device{}, false, nil // no gateway has run with this run directory
	}
	if err != nil {
		return Device{}, false, err
	}
	var best *statefile.State
	bestAlive := false
	for _, e := range entries {
		gw, isState := strings.CutSuffix(e.Name(), ".json")
		if !isState || !e.Type().IsRegular() || control.ValidateName(gw) != nil {
			continue // temporary files (".NAME.json.tmp…"), locks, sockets
		}
		st, err := readState(filepath.Join(dir, e.Name()))
		switch {
		case err != nil:
			warn(err)
			continue
		case st.Name != gw:
			warn(fmt.Errorf("%s names gateway %q: skipped", filepath.Join(dir, e.Name()), st.Name))
			continue
		case st.Kind != modes.Ublk || st.DevID != id:
			continue
		}
		alive := pidAlive(st.PID)
		if best == nil || (alive && !bestAlive) || (alive == bestAlive && st.Updated.After(best.Updated)) {
			best, bestAlive = &st, alive
		}
	}
	if best == nil {
		return Device{}, false, nil
	}
	return Device{Name: best.Name, Target: best.LUN.Target}, true, nil
}

// readState reads one state file without following a symbolic link or blocking on a FIFO put
// in its place, and no more than maxStateBytes of it.
func readState(path string) (statefile.State, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return statefile.State{}, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return statefile.State{}, fmt.Errorf("%s: not a regular file", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxStateBytes))
	if err != nil {
		return statefile.State{}, fmt.Errorf("%s: %w", path, err)
	}
	st, err := statefile.Decode(data)
	if err != nil {
		return statefile.State{}, fmt.Errorf("%s: %w", path, err)
	}
	return st, nil
}

// pidAlive reports whether a process pid exists (EPERM: it does, owned by someone else).
func pidAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
