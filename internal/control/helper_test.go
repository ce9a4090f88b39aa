package control

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/status"
)

// The test binary doubles as a child process: a fake gateway (to be killed or detached) and an
// unprivileged client. helperEnv selects the role.
const helperEnv = "CONTROL_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "gateway":
		os.Exit(runHelperGateway(os.Getenv("RUN_DIR"), os.Getenv("NAME")))
	case "dial":
		os.Exit(runHelperDial(os.Getenv("SOCKET")))
	}
	os.Exit(m.Run())
}

// fakeGateway is a Handler whose detach walks the lifecycle like a write-back gateway would.
type fakeGateway struct {
	reg       *status.Registry
	lm        *lifecycle.Machine
	refuse    string // non-empty: Detach without force is refused with this
	failFlush error
	stall     bool // Detach waits for its context to end (a write-back that makes no progress)
	// entered, when set, is closed as Detach starts, which then waits for hold to close.
	entered, hold chan struct{}
}

func newFakeGateway(name string) *fakeGateway {
	lm := lifecycle.New()
	_ = lm.To(lifecycle.Ready, "")
	return &fakeGateway{lm: lm, reg: status.NewRegistry(status.Identity{
		Name: name, Device: name, FrontendKind: "nbd", FrontendPath: "/dev/fake-" + name,
		Targets: []string{"iscsi://127.0.0.1/iqn.test/0"}, CacheMode: modes.WriteBack,
	}, lm)}
}

func (g *fakeGateway) Status() status.Status { return g.reg.Snapshot() }

func (g *fakeGateway) Detach(ctx context.Context, req Request) (DetachResult, error) {
	if g.refuse != "" && !req.Force {
		return DetachResult{}, Refused("%s", g.refuse)
	}
	if g.stall {
		<-ctx.Done()
		return DetachResult{}, ctx.Err()
	}
	if g.entered != nil {
		close(g.entered)
		<-g.hold
	}
	if err := g.lm.To(lifecycle.Draining, "detach"); err != nil {
		return DetachResult{}, err
	}
	_ = g.lm.To(lifecycle.Flushing, "")
	for i := uint64(1); i <= 3; i++ {
		g.lm.ReportFlush(lifecycle.FlushProgress{DirtyBytes: 3 - i, WrittenBackBytes: i})
	}
	if g.failFlush != nil {
		_ = g.lm.To(lifecycle.Ready, g.failFlush.Error())
		return DetachResult{}, g.failFlush
	}
	_ = g.lm.To(lifecycle.Stopped, "detached")
	return DetachResult{PID: os.Getpid(), WrittenBackBytes: 3}, nil
}

func runHelperGateway(dir, name string) int {
	c, err := ClaimName(dir, name)
	if err != nil {
		fmt.Println("claim:", err)
		return 2
	}
	g := newFakeGateway(name)
	s, err := Listen(c, g, Options{Lifecycle: g.lm})
	if err != nil {
		fmt.Println("listen:", err)
		return 1
	}
	go s.Serve()
	fmt.Println("ready")
	<-s.Detached()
	s.Close()
	c.Release()
	return 0
}

// startHelperGateway starts a fake gateway child and returns once it serves.
func startHelperGateway(t *testing.T, dir, name string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"=gateway", "RUN_DIR="+dir, "NAME="+name)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("helper gateway: %q %v", line, err)
	}
	go io.Copy(io.Discard, out)
	return cmd
}

// testRunDir returns a fresh run directory that does not exist yet (ClaimName creates it).
func testRunDir(t *testing.T) string {
	return filepath.Join(t.TempDir(), "run")
}

// serveInProcess claims name and serves g in this process until the test ends.
func serveInProcess(t *testing.T, dir, name string, g *fakeGateway, opts Options) *Server {
	t.Helper()
	c, err := ClaimName(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Lifecycle == nil {
		opts.Lifecycle = g.lm
	}
	return serveHandler(t, c, g, opts)
}

// serveHandler serves h under claim c in this process until the test ends.
func serveHandler(t *testing.T, c *Claim, h Handler, opts Options) *Server {
	t.Helper()
	s, err := Listen(c, h, opts)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		c.Release()
	})
	return s
}

// rawConn sends lines and reads reply lines on one connection.
type rawConn struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

func dialRaw(t *testing.T, dir, name string) *rawConn {
	conn, err := net.Dial("unix", SocketPath(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &rawConn{t: t, conn: conn, r: bufio.NewReader(conn)}
}

func (c *rawConn) send(line string) Reply {
	c.t.Helper()
	if _, err := c.conn.Write([]byte(line + "\n")); err != nil {
		c.t.Fatal(err)
	}
	return c.read()
}

func (c *rawConn) read() Reply {
	c.t.Helper()
	line, err := c.r.ReadBytes('\n')
	if err != nil {
		c.t.Fatalf("read reply: %v", err)
	}
	var r Reply
	if err := json.Unmarshal(line, &r); err != nil {
		c.t.Fatalf("reply %q: %v", line, err)
	}
	if r.Version != ProtocolVersion {
		c.t.Fatalf("reply without version: %s", line)
	}
	return r
}
