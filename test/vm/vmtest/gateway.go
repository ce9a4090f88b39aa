//go:build vm

package vmtest

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/internal/syncbuf"
)

// Gateway is a gateway process a VM test started with StartGateway: `iser-blk attach`, or a
// test binary serving in its place, which printed its device path as the first line of stdout.
type Gateway struct {
	Cmd    *exec.Cmd
	Device string          // the first line the process printed, trimmed: its device path
	Stderr *syncbuf.Buffer // what the process has written to stderr
	Exited chan struct{}   // closed when the process has exited (not when its stdout closes)
	Err    error           // cmd.Wait's result; read it only after Exited is closed
}

// GatewayOptions are StartGateway's knobs; the zero value is the usual case.
type GatewayOptions struct {
	// Announce bounds the wait for the device line (default 2 minutes: under QEMU/TCG a
	// gateway logging in to a target takes seconds, one setting up ublk queues longer).
	Announce time.Duration
	// LogStderr logs the process's stderr when the test ends even if it passed; a failed test
	// always gets it.
	LogStderr bool
}

// StartGateway starts cmd with its stdout and stderr taken over (cmd.Stdout and cmd.Stderr must
// be unset) and waits for the first line of its stdout, which `attach` prints once the device
// serves. It fails t if the process exits first or opts.Announce passes. When the test ends it
// stops the process if it still runs (Stop) and logs its stderr if the test failed (or
// opts.LogStderr). The caller checks Device's form (an NBD or a ublk path).
//
// Stdout is an os.Pipe, not cmd.StdoutPipe: Wait then neither closes the read end under the
// reader (which could lose the line) nor waits for it, so Exited means the process is gone even
// if a child of it still holds stdout.
func StartGateway(t testing.TB, cmd *exec.Cmd, opts GatewayOptions) *Gateway {
	t.Helper()
	if opts.Announce == 0 {
		opts.Announce = 2 * time.Minute
	}
	g := &Gateway{Cmd: cmd, Stderr: &syncbuf.Buffer{}, Exited: make(chan struct{})}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, g.Stderr
	err = cmd.Start()
	w.Close() // the child holds its own copy
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	line := make(chan string, 1)
	go func() {
		br := bufio.NewReader(r)
		if s, err := br.ReadString('\n'); err == nil {
			line <- strings.TrimSpace(s)
		}
		io.Copy(io.Discard, br)
	}()
	go func() { g.Err = cmd.Wait(); close(g.Exited) }()
	t.Cleanup(func() {
		g.Stop()
		r.Close() // ends the reader if a child of the process still holds stdout
		if t.Failed() || opts.LogStderr {
			t.Logf("%s stderr:\n%s", filepath.Base(cmd.Path), g.Stderr)
		}
	})
	select {
	case g.Device = <-line:
	case <-g.Exited:
		t.Fatalf("%s exited (%v) before printing its device: %s", filepath.Base(cmd.Path), g.Err, g.Stderr)
	case <-time.After(opts.Announce):
		t.Fatalf("%s printed no device within %v: %s", filepath.Base(cmd.Path), opts.Announce, g.Stderr)
	}
	return g
}

// Detach stops the gateway the way an operator does (SIGINT: write back, disconnect the device)
// and fails the test, saying what, if that fails or takes more than 2 minutes. A gateway left to
// StartGateway's cleanup (Stop, kill -9) leaves a kernel NBD device configured for a successor.
func (g *Gateway) Detach(t testing.TB, what string) {
	t.Helper()
	g.Cmd.Process.Signal(os.Interrupt)
	select {
	case <-g.Exited:
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s: the gateway still runs 2 min after SIGINT\n%s", what, g.Stderr)
	}
	if g.Err != nil {
		t.Fatalf("%s: %v\n%s", what, g.Err, g.Stderr)
	}
}

// NBDServed reports whether a server is connected to the kernel NBD device dev (/dev/nbdN): the
// kernel shows the pid attribute only while one is.
func NBDServed(dev string) bool {
	_, err := os.Stat("/sys/block/" + filepath.Base(dev) + "/pid")
	return !errors.Is(err, os.ErrNotExist)
}

// Stop kills the process unless it has exited, and waits until it has. It may be called more
// than once, and before StartGateway's own cleanup (to remove what the process left behind only
// once it is gone).
func (g *Gateway) Stop() {
	select {
	case <-g.Exited:
	default:
		g.Cmd.Process.Kill()
		<-g.Exited
	}
}
