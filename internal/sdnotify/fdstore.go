package sdnotify

// systemd's file descriptor store (sd_notify(3) FDSTORE=1, FDNAME=, FDSTOREREMOVE=1;
// sd_listen_fds(3); https://systemd.io/FILE_DESCRIPTOR_STORE/): a service whose unit sets
// FileDescriptorStoreMax= hands descriptors to the service manager, which keeps them while the
// service is running or a job for it is queued (a `systemctl restart`'s start), drops one when
// it sees POLLHUP or POLLERR on it, and passes what it holds to the next ExecStart= process as
// LISTEN_FDS from descriptor 3 on, named in LISTEN_FDNAMES. The store keeps what it holds until
// the service removes it (FDSTOREREMOVE=1) or the unit ends with no job queued: a successor
// removes what it took, or a later start would be given it again.

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/coreos/go-systemd/v22/activation"
	"golang.org/x/sys/unix"
)

// FDStore is this process's systemd file descriptor store. The zero value is ready.
type FDStore struct{}

// Available reports whether a store may take descriptors: the process was started by systemd
// with a notification socket, and its unit may have a store. systemd 254 and later set $FDSTORE
// to FileDescriptorStoreMax= when it is not 0 and leave it unset otherwise; earlier versions
// (Debian 12's 252) never set it, so without it the answer is yes — a unit without a store then
// drops what it is sent, with a warning in its journal.
func (FDStore) Available() bool {
	if os.Getenv("NOTIFY_SOCKET") == "" {
		return false
	}
	v, ok := os.LookupEnv("FDSTORE")
	if !ok {
		return true
	}
	n, err := strconv.Atoi(v)
	return err == nil && n > 0
}

// Store sends fds to the store under name, in one message (FDSTORE=1, FDNAME=name). The store
// keeps copies: the caller still owns fds.
func (FDStore) Store(name string, fds []int) error {
	if err := checkName(name); err != nil {
		return err
	}
	if len(fds) == 0 {
		return errors.New("sd_notify FDSTORE: no descriptor to store")
	}
	return notifyWithFDs("FDSTORE=1\nFDNAME="+name, unix.UnixRights(fds...))
}

// Remove drops every descriptor the store keeps under name (FDSTOREREMOVE=1).
func (FDStore) Remove(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	return notifyWithFDs("FDSTOREREMOVE=1\nFDNAME="+name, nil)
}

// Take returns the descriptors the store passed this process at start, by name (in no
// particular order: systemd does not keep the order they were stored in), and unsets LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES so that neither a
// second call nor a re-executed image takes them again. The files are close-on-exec.
func (FDStore) Take() map[string][]*os.File {
	files := activation.Files(true)
	if len(files) == 0 {
		return nil
	}
	byName := make(map[string][]*os.File)
	for _, f := range files {
		byName[f.Name()] = append(byName[f.Name()], f)
	}
	return byName
}

// checkName applies systemd's rule for FDNAME= (fdname_is_valid): 1 to 255 printable ASCII
// characters, no colon (LISTEN_FDNAMES separates the names with colons).
func checkName(name string) error {
	if name == "" || len(name) > 255 {
		return fmt.Errorf("sd_notify: descriptor name %q: want 1 to 255 characters", name)
	}
	for _, r := range name {
		if r < ' ' || r > '~' || r == ':' {
			return fmt.Errorf("sd_notify: descriptor name %q: printable ASCII without ':' only", name)
		}
	}
	return nil
}

// notifyWithFDs sends one datagram to NOTIFY_SOCKET with oob as its control message (go-systemd's
// daemon.SdNotify cannot pass descriptors). A leading '@' names an abstract socket
// (x/sys/unix's SockaddrUnix knows it).
func notifyWithFDs(state string, oob []byte) error {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return errors.New("sd_notify: NOTIFY_SOCKET is not set: not started by systemd")
	}
	if !strings.HasPrefix(path, "/") && !strings.HasPrefix(path, "@") {
		return fmt.Errorf("sd_notify: NOTIFY_SOCKET %q is not a unix socket path", path)
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	defer unix.Close(fd)
	n, err := unix.SendmsgN(fd, []byte(state), oob, &unix.SockaddrUnix{Name: path}, 0)
	switch {
	case err != nil:
		return fmt.Errorf("sd_notify: %w", err)
	case n != len(state):
		return fmt.Errorf("sd_notify: short write (%d of %d bytes)", n, len(state))
	}
	return nil
}
