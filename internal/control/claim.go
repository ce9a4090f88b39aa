package control

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// NameInUseError is ClaimName's answer when another running process holds the name.
type NameInUseError struct {
	Name string
	PID  int // 0 if the holder had not yet written its PID (it was starting)
}

func (e *NameInUseError) Error() string {
	if e.PID == 0 {
		return fmt.Sprintf("gateway name %q is in use by a gateway that is starting", e.Name)
	}
	return fmt.Sprintf("gateway name %q is in use by PID %d", e.Name, e.PID)
}

// Claim is a held gateway name. Release it on exit; if the process dies instead, the kernel
// releases the flock and the next ClaimName replaces the files left behind.
type Claim struct {
	Dir, Name string
	lock      *os.File
}

// ClaimName validates name, makes sure dir exists with the right mode, and takes the name: an
// exclusive flock on NAME.lock, which then holds this PID. A socket file left by a previous
// holder is removed (no one can be serving it: its holder's lock is gone).
func ClaimName(dir, name string) (*Claim, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if err := EnsureRunDir(dir); err != nil {
		return nil, err
	}
	// A releasing holder unlinks the lock file before unlocking it; if we opened that inode we
	// hold a lock nobody else will look at, so we retry on the file now at the path.
	for attempt := 0; attempt <= lockProbeRetries; attempt++ {
		f, err := lockFile(dir, name, true)
		if err != nil {
			return nil, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			pid := readPID(f)
			f.Close()
			if !errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("claim %q: flock: %w", name, err)
			}
			if processAlive(pid) || attempt >= lockProbeRetries {
				return nil, &NameInUseError{Name: name, PID: pid}
			}
			// The recorded holder is dead: the lock is held for a moment by `list` probing
			// for stale files, or by a gateway that has not written its PID yet. Try again.
			time.Sleep(lockProbeWait)
			continue
		}
		if !stillAtPath(f, LockPath(dir, name)) {
			f.Close()
			continue
		}
		if err := writePID(f); err != nil {
			f.Close()
			return nil, err
		}
		if err := os.Remove(SocketPath(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			f.Close()
			return nil, fmt.Errorf("claim %q: remove stale socket: %w", name, err)
		}
		return &Claim{Dir: dir, Name: name, lock: f}, nil
	}
	return nil, fmt.Errorf("claim %q: the lock file keeps being replaced", name)
}

// A claim that finds the lock held while the PID in it is dead retries this often, this far
// apart: long enough for a stale-file probe or a starting gateway to write its PID.
const (
	lockProbeRetries = 20
	lockProbeWait    = 10 * time.Millisecond
)

// processAlive reports whether pid is a running process (kill(pid, 0); EPERM means it exists).
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// SocketPath is the claimed name's control socket.
func (c *Claim) SocketPath() string { return SocketPath(c.Dir, c.Name) }

// Release removes the socket and lock files and gives the name up. Files are removed while the
// lock is still held, so no other process can see a claimed name without its files.
func (c *Claim) Release() error {
	if c.lock == nil {
		return nil
	}
	err := removeIfExists(c.SocketPath())
	if e := removeIfExists(LockPath(c.Dir, c.Name)); err == nil {
		err = e
	}
	if e := c.lock.Close(); err == nil {
		err = e
	}
	c.lock = nil
	return err
}

func lockFile(dir, name string, create bool) (*os.File, error) {
	flags := os.O_RDWR
	if create {
		flags |= os.O_CREATE
	}
	f, err := os.OpenFile(LockPath(dir, name), flags, 0o600)
	if err != nil {
		return nil, fmt.Errorf("claim %q: %w", name, err)
	}
	return f, nil
}

func stillAtPath(f *os.File, path string) bool {
	held, err1 := f.Stat()
	now, err2 := os.Stat(path)
	return err1 == nil && err2 == nil && os.SameFile(held, now)
}

func writePID(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return fmt.Errorf("lock file: %w", err)
	}
	if _, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
		return fmt.Errorf("lock file: %w", err)
	}
	return nil
}

func readPID(f *os.File) int {
	b, err := io.ReadAll(io.NewSectionReader(f, 0, 32))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return pid
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// probeStale reports whether name in dir is held by nobody, and if so removes its files while
// holding the lock. A name whose lock file is missing is stale when its socket exists (a holder
// creates the lock before the socket and removes it after).
func probeStale(dir, name string) (stale bool) {
	f, err := lockFile(dir, name, false)
	if errors.Is(err, os.ErrNotExist) {
		return removeIfExists(SocketPath(dir, name)) == nil
	}
	if err != nil {
		return false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return false // held: alive (or starting)
	}
	_ = removeIfExists(SocketPath(dir, name))
	if stillAtPath(f, LockPath(dir, name)) {
		_ = os.Remove(LockPath(dir, name))
	}
	return true
}

func fileUID(fi os.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}
