package control

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

func TestDialUnknownNameExits4(t *testing.T) {
	dir := testRunDir(t)
	for _, name := range []string{"nope", "/dev/nbd99", "bad name"} {
		_, err := Dial(t.Context(), dir, name)
		if !errors.Is(err, ErrUnknownGateway) || ExitCode(err) != 4 {
			t.Errorf("Dial(%q) = %v (exit %d), want ErrUnknownGateway, exit 4", name, err, ExitCode(err))
		}
	}
}

func TestStatusByNameAndByDevice(t *testing.T) {
	dir := testRunDir(t)
	serveInProcess(t, dir, "gw", newFakeGateway("gw"), Options{})
	for _, arg := range []string{"gw", "/dev/fake-gw"} {
		c, err := Dial(t.Context(), dir, arg)
		if err != nil {
			t.Fatalf("Dial(%q): %v", arg, err)
		}
		st, err := c.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if st.Version != 1 || st.Gateway.Name != "gw" || st.Gateway.State != "ready" ||
			st.Gateway.PID != os.Getpid() || st.Gateway.Targets[0] != "iscsi://127.0.0.1/iqn.test/0" {
			t.Fatalf("status %+v", st.Gateway)
		}
	}
}

func TestListShowsEveryRunningGateway(t *testing.T) {
	dir := testRunDir(t)
	serveInProcess(t, dir, "a", newFakeGateway("a"), Options{})
	child := startHelperGateway(t, dir, "b")
	entries, err := List(t.Context(), dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 || entries[0].Name != "a" || entries[1].Name != "b" {
		t.Fatalf("entries %+v", entries)
	}
	for _, e := range entries {
		if e.Err != nil {
			t.Fatalf("%s: %v", e.Name, e.Err)
		}
	}
	if entries[1].Status.Gateway.PID != child.Process.Pid {
		t.Fatalf("b's PID %d, child %d", entries[1].Status.Gateway.PID, child.Process.Pid)
	}
}

func TestListOfMissingRunDirIsEmpty(t *testing.T) {
	entries, err := List(t.Context(), testRunDir(t), 0)
	if err != nil || len(entries) != 0 {
		t.Fatalf("%+v %v", entries, err)
	}
}

// TestDetachStreamsProgressAndWaitsForExit detaches a real gateway process: the client sees the
// lifecycle and write-back progress, and Detach returns only once the process is gone.
func TestDetachStreamsProgressAndWaitsForExit(t *testing.T) {
	dir := testRunDir(t)
	child := startHelperGateway(t, dir, "gw")
	c, err := Dial(t.Context(), dir, "gw")
	if err != nil {
		t.Fatal(err)
	}
	var seen []Progress
	res, err := c.Detach(t.Context(), DetachOptions{Timeout: time.Minute}, func(p Progress) { seen = append(seen, p) })
	if err != nil {
		t.Fatal(err)
	}
	if res.PID != child.Process.Pid || res.WrittenBackBytes != 3 {
		t.Fatalf("result %+v, child %d", res, child.Process.Pid)
	}
	// The pidfd said it exited, so Wait reaps a zombie without blocking.
	if st, werr := child.Process.Wait(); werr != nil || st.ExitCode() != 0 {
		t.Fatalf("gateway after detach: %v %v", st, werr)
	}
	var states []string
	var lastWritten uint64
	for _, p := range seen {
		if len(states) == 0 || states[len(states)-1] != p.State {
			states = append(states, p.State)
		}
		if p.WrittenBackBytes > 0 {
			lastWritten = p.WrittenBackBytes
		}
	}
	if got := strings.Join(states, ","); got != "draining,flushing,stopped" {
		t.Fatalf("progress states %s (%+v)", got, seen)
	}
	if lastWritten != 3 {
		t.Fatalf("progress never reported the 3 bytes written back: %+v", seen)
	}
	if _, err := os.Stat(SocketPath(dir, "gw")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left after detach: %v", err)
	}
}

func TestDetachRefusedUnlessForced(t *testing.T) {
	dir := testRunDir(t)
	g := newFakeGateway("gw")
	g.refuse = "mounted at /mnt"
	s := serveInProcess(t, dir, "gw", g, Options{})
	c, err := Dial(t.Context(), dir, "gw")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Detach(t.Context(), DetachOptions{}, nil)
	var ce *Error
	if !errors.As(err, &ce) || ce.Code != CodeRefused || !strings.Contains(ce.Message, "/mnt") || ExitCode(err) != 1 {
		t.Fatalf("detach of a mounted device: %v", err)
	}
	select {
	case <-s.Detached():
		t.Fatal("a refused detach signalled Detached")
	default:
	}
	res, err := c.Detach(t.Context(), DetachOptions{Force: true}, nil)
	if err != nil || res.WrittenBackBytes != 3 {
		t.Fatalf("forced detach: %+v %v", res, err)
	}
	<-s.Detached()
}

func TestFailedWriteBackKeepsGatewayServing(t *testing.T) {
	dir := testRunDir(t)
	g := newFakeGateway("gw")
	g.failFlush = errors.New("WRITE(16): MEDIUM ERROR")
	serveInProcess(t, dir, "gw", g, Options{})
	c, err := Dial(t.Context(), dir, "gw")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Detach(t.Context(), DetachOptions{}, nil)
	var ce *Error
	if !errors.As(err, &ce) || ce.Code != CodeFailed || !strings.Contains(ce.Message, "MEDIUM ERROR") {
		t.Fatalf("detach with failing write-back: %v", err)
	}
	st, err := c.Status(t.Context())
	if err != nil || st.Gateway.State != "ready" || !strings.Contains(st.Gateway.StateReason, "MEDIUM ERROR") {
		t.Fatalf("after failed detach: %+v %v", st.Gateway, err)
	}
}

func TestExitCode(t *testing.T) {
	if ExitCode(nil) != 0 || ExitCode(&Error{Code: CodeTimeout}) != 1 || ExitCode(ErrUnknownGateway) != 4 {
		t.Fatal("exit codes")
	}
}

// TestStaleSocketIsUnknown: a socket file without a gateway (killed, lock free) answers like
// no gateway at all, exit 4.
func TestStaleSocketIsUnknown(t *testing.T) {
	dir := testRunDir(t)
	cmd := startHelperGateway(t, dir, "gw")
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	c, err := Dial(t.Context(), dir, "gw")
	if err == nil {
		_, err = c.Status(t.Context())
	}
	if !errors.Is(err, ErrUnknownGateway) || ExitCode(err) != 4 {
		t.Fatalf("status of a killed gateway: %v", err)
	}
}

func TestDetachTimeout(t *testing.T) {
	dir := testRunDir(t)
	g := newFakeGateway("gw")
	g.stall = true
	serveInProcess(t, dir, "gw", g, Options{})
	c, err := Dial(t.Context(), dir, "gw")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Detach(t.Context(), DetachOptions{Timeout: 50 * time.Millisecond}, nil)
	var ce *Error
	if !errors.As(err, &ce) || ce.Code != CodeTimeout || ExitCode(err) != 1 {
		t.Fatalf("stalled detach with a timeout: %v", err)
	}
}

// TestProgressString: how detach, restart and stop --keep show a gateway's progress.
func TestProgressString(t *testing.T) {
	for _, tt := range []struct {
		p    Progress
		want string
	}{
		{Progress{State: "flushing", DirtyBytes: 3 << 20, WrittenBackBytes: 1 << 10}, "flushing: 1.0 KiB written back, 3.0 MiB to go"},
		{Progress{State: "flushing", WrittenBackBytes: 1 << 20}, "flushing: 1.0 MiB written back, 0 B to go"},
		{Progress{State: "draining", Reason: "detach"}, "draining: detach"},
		{Progress{State: "stopped"}, "stopped"},
	} {
		if got := tt.p.String(); got != tt.want {
			t.Errorf("%+v: %q, want %q", tt.p, got, tt.want)
		}
	}
}
