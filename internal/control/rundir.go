package control

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
)

// DefaultRunDir is where gateways keep their control sockets unless told otherwise.
const DefaultRunDir = "/run/iser-blk"

// RunDirEnv overrides DefaultRunDir (tests, or a second set of gateways).
const RunDirEnv = "ISERBLK_RUN_DIR"

// MaxNameLen bounds a gateway name so that RUNDIR/NAME.sock fits sockaddr_un's 108 bytes
// under the default run directory with room to spare.
const MaxNameLen = 64

var validName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// RunDir returns the run directory: flagValue (the --run-dir flag) if set, else $ISERBLK_RUN_DIR,
// else DefaultRunDir.
func RunDir(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if env := os.Getenv(RunDirEnv); env != "" {
		return env
	}
	return DefaultRunDir
}

// ValidateName checks that name is usable as a gateway name: 1 to MaxNameLen characters from
// [A-Za-z0-9._-], not starting with '.', '_' or '-' (no hidden files, no option look-alikes, no
// path separators).
func ValidateName(name string) error {
	if name == "" {
		return &BadNameError{"gateway name is empty"}
	}
	if len(name) > MaxNameLen {
		return &BadNameError{fmt.Sprintf("gateway name %.20q… is %d bytes, more than %d", name, len(name), MaxNameLen)}
	}
	if !validName.MatchString(name) {
		return &BadNameError{fmt.Sprintf("gateway name %q: use letters, digits, '.', '_' and '-', starting with a letter or digit", name)}
	}
	return nil
}

// BadNameError is ValidateName's: the name cannot be a gateway's. The CLI exits 2 on it (a bad
// argument), as it does for a name another gateway holds (NameInUseError).
type BadNameError struct{ Reason string }

func (e *BadNameError) Error() string { return e.Reason }

// SocketPath is the control socket of name in dir.
func SocketPath(dir, name string) string { return filepath.Join(dir, name+".sock") }

// LockPath is the file whose flock is name's claim.
func LockPath(dir, name string) string { return filepath.Join(dir, name+".lock") }

// EnsureRunDir creates dir (mode 0700) if needed and checks that it is a directory owned by
// this user and closed to everyone else, tightening the mode of one this user owns.
func EnsureRunDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("run directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("run directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("run directory %s is not a directory", dir)
	}
	if uid := fileUID(fi); uid != os.Geteuid() {
		return fmt.Errorf("run directory %s is owned by uid %d, not %d", dir, uid, os.Geteuid())
	}
	if fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("run directory: %w", err)
		}
	}
	return nil
}
