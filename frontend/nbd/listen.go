package nbd

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"syscall"
	"time"
)

// SpecError is a listen spec Listen cannot use: not unix:///PATH nor tcp://HOST:PORT.
type SpecError struct {
	Spec   string // as given
	Reason string // what is wrong with it
}

func (e *SpecError) Error() string { return fmt.Sprintf("nbd: listen spec %q: %s", e.Spec, e.Reason) }

// ErrNotSocket is Listen's error for a unix socket path that holds something other than a
// socket, which it never removes.
var ErrNotSocket = errors.New("exists and is not a socket; not removing it")

// Listen opens a listener for the server from spec, unix:///PATH or tcp://HOST:PORT, and returns
// the NBD URI clients connect with (nbd+unix:///?socket=PATH, nbd://HOST:PORT/ with the port the
// kernel picked for port 0). A unix socket is created mode 0600, as NBD has no authentication:
// only its owner may connect. A socket file left at PATH by a previous server is removed first,
// but only when nobody listens on it; a live server's socket and any other file are left alone
// (ErrNotSocket).
func Listen(spec string) (net.Listener, string, error) {
	u, err := url.Parse(spec)
	if err != nil {
		return nil, "", &SpecError{spec, err.Error()}
	}
	switch u.Scheme {
	case "unix":
		path := u.Path
		if path == "" {
			return nil, "", &SpecError{spec, "no socket path"}
		}
		if err := removeStaleSocket(path); err != nil {
			return nil, "", err
		}
		// Create the socket 0600: only the owner may connect (NBD has no authentication).
		old := syscall.Umask(0o177)
		l, err := net.Listen("unix", path)
		syscall.Umask(old)
		if err != nil {
			return nil, "", fmt.Errorf("listen on %s: %w", path, err)
		}
		if err := os.Chmod(path, 0o600); err != nil {
			l.Close()
			return nil, "", fmt.Errorf("chmod %s: %w", path, err)
		}
		return l, "nbd+unix:///?socket=" + path, nil
	case "tcp":
		if u.Host == "" || u.Port() == "" {
			return nil, "", &SpecError{spec, "need tcp://host:port"}
		}
		l, err := net.Listen("tcp", u.Host)
		if err != nil {
			return nil, "", fmt.Errorf("listen on %s: %w", u.Host, err)
		}
		return l, "nbd://" + l.Addr().String() + "/", nil
	default:
		return nil, "", &SpecError{spec, "scheme must be unix:// or tcp://"}
	}
}

// removeStaleSocket removes a socket file left behind by a previous run, but only when it is a
// socket nobody is listening on: never a regular file, never a live server's socket.
func removeStaleSocket(path string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s %w", path, ErrNotSocket)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("%s: another server is listening on it", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%s: cannot tell whether the socket is stale: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("removing stale socket %s: %w", path, err)
	}
	return nil
}
