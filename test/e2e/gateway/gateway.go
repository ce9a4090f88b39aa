//go:build e2e

// Package gateway runs the real `iser-blk serve` binary for host end-to-end tests: it starts the
// process on a private unix socket, waits for the NBD URI it prints on stdout, collects its log,
// and stops it with SIGTERM requiring exit 0. Anything still running at the end of the test is
// killed by t.Cleanup, and a failed test gets the server's log.
//
// The binary is $ISERBLK_BIN or bin/iser-blk at the module root (`make build`).
//
// Progress is observed, never assumed after a fixed sleep: WaitWritten polls the process's
// /proc/PID/io write counter (every byte it sends to the target or the client), WaitLog its log.
package gateway

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/internal/syncbuf"
)

// Binary returns the path of the iser-blk binary under test.
func Binary(t testing.TB) string {
	t.Helper()
	if b := os.Getenv("ISERBLK_BIN"); b != "" {
		return b
	}
	dir, _ := os.Getwd()
	for ; dir != "/"; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "bin", "iser-blk")
		}
	}
	t.Fatal("cannot find the module root; set ISERBLK_BIN")
	return ""
}

// Server is a running `iser-blk serve`.
type Server struct {
	URI    string // the NBD URI the server printed (nbd+unix:///?socket=...)
	cmd    *exec.Cmd
	log    *syncbuf.Buffer
	waited chan error // receives cmd.Wait's result once; whoever takes it puts it back
}

// Start runs `iser-blk serve --target target --listen unix://<tmp>/nbd.sock extra...` and
// returns once the server has printed its URI. The socket must be mode 0600 (only the owner may
// reach the disk).
func Start(t testing.TB, target string, extra ...string) *Server {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "nbd.sock")
	s := StartListen(t, target, "unix://"+sock, extra...)
	if st, err := os.Stat(sock); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket %s: %v mode %v, want 0600", sock, err, st.Mode())
	}
	return s
}

// StartListen is Start with another --listen address (e.g. tcp://127.0.0.1:0 for TLS tests).
func StartListen(t testing.TB, target, listen string, extra ...string) *Server {
	t.Helper()
	// A private run directory (a later --run-dir in extra wins): concurrent tests' gateways would
	// otherwise share /run/iser-blk and the default name, the socket's base name.
	args := append([]string{"serve", "--target", target, "--listen", listen, "--run-dir", t.TempDir()}, extra...)
	cmd := exec.Command(Binary(t), args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{cmd: cmd, log: &syncbuf.Buffer{}, waited: make(chan error, 1)}
	cmd.Stderr = s.log
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", cmd, err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		io.Copy(io.Discard, stdout)
		s.waited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		select {
		case err := <-s.waited:
			s.waited <- err
		default:
			cmd.Process.Kill()
			<-s.waited
		}
		if t.Failed() {
			t.Logf("server log:\n%s", s.log)
		}
	})
	select {
	case uri, ok := <-lines:
		if !ok {
			t.Fatalf("serve exited before listening: %s", s.log)
		}
		s.URI = uri
	case <-time.After(2 * time.Minute):
		t.Fatalf("serve did not print its URI within 2 min: %s", s.log)
	}
	return s
}

// Stop sends SIGTERM and requires exit 0 within 2 minutes (the final flush and logout).
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-s.waited:
		s.waited <- err
		if err != nil {
			t.Fatalf("serve exited with %v: %s", err, s.log)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("serve did not exit 2 min after SIGTERM: %s", s.log)
	}
}

// Signal sends sig to the server (SIGHUP: reload the TLS certificates).
func (s *Server) Signal(t testing.TB, sig os.Signal) {
	t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// Log is everything the server has written to stderr so far.
func (s *Server) Log() string { return s.log.String() }

// LogLines returns the server's log lines containing msg.
func (s *Server) LogLines(msg string) []string {
	var out []string
	for _, l := range strings.Split(s.log.String(), "\n") {
		if strings.Contains(l, msg) {
			out = append(out, l)
		}
	}
	return out
}

// WaitLog waits until the server has logged msg at least n times, polling its log, and fails
// the test with the log if that takes longer than within. It returns the matching lines.
func (s *Server) WaitLog(t testing.TB, msg string, n int, within time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		lines := s.LogLines(msg)
		if len(lines) >= n {
			return lines
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d %q lines in the log after %v:\n%s", len(lines), n, msg, within, s.Log())
		}
		<-tick.C
	}
}

// Written is the number of bytes the server process has passed to write-family system calls
// (wchar in /proc/PID/io): NBD replies to the client and PDUs to the target.
func (s *Server) Written() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", s.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "wchar: "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("no wchar in /proc/%d/io", s.cmd.Process.Pid)
}

// WaitWritten returns once the server has written at least n more bytes than when it was called
// (proof that a client is doing I/O through it), or fails the test after timeout.
func (s *Server) WaitWritten(t testing.TB, n int64, timeout time.Duration) {
	t.Helper()
	base, err := s.Written()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for range tick.C {
		w, err := s.Written()
		if err != nil {
			t.Fatal(err)
		}
		if w-base >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server wrote %d bytes in %v, want at least %d: is the client doing I/O?", w-base, timeout, n)
		}
	}
}

// PID is the server's process ID.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Wait returns the server's exit status once it has exited, failing the test if it has not
// within timeout (it is then killed by the cleanup).
func (s *Server) Wait(t testing.TB, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-s.waited:
		s.waited <- err
		return err
	case <-time.After(timeout):
		t.Fatalf("the server did not exit within %v: %s", timeout, s.log)
		return nil
	}
}
