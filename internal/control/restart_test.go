package control

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/internal/lifecycle"
)

// restartingGateway is a fakeGateway that offers OpRestart.
type restartingGateway struct {
	*fakeGateway
	flushErr  error
	stuck     bool     // the drain never ends: Restart waits for its context
	writeBack []uint64 // the written-back bytes Restart reports, in order
	reexeced  chan struct{}
}

func (g *restartingGateway) Restart(ctx context.Context, _ Request) (func() error, error) {
	if g.stuck {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if g.flushErr != nil {
		return nil, g.flushErr
	}
	for _, n := range g.writeBack { // the write-back, as the gateway's flush reports it
		g.lm.ReportFlush(lifecycle.FlushProgress{WrittenBackBytes: n})
	}
	return func() error { close(g.reexeced); return nil }, nil
}

func serveRestarting(t *testing.T, dir, name string, g *restartingGateway) {
	t.Helper()
	c, err := ClaimName(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	serveHandler(t, c, g, Options{Lifecycle: g.lm})
}

func TestRestartAnswersThenReexecs(t *testing.T) {
	dir := testRunDir(t)
	g := &restartingGateway{fakeGateway: newFakeGateway("gw"), reexeced: make(chan struct{})}
	serveRestarting(t, dir, "gw", g)
	c, err := Dial(context.Background(), dir, "gw")
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Restart(context.Background(), RestartOptions{}, nil)
	if err != nil || res.PID != os.Getpid() {
		t.Fatalf("restart: %+v, %v", res, err)
	}
	<-g.reexeced // the re-exec step runs after the answer (a hang here fails the test by timeout)
}

// The answer to a restart carries the bytes written back on the way, however many progress
// lines the client was shown (a slow client misses some).
func TestRestartReportsWrittenBack(t *testing.T) {
	dir := testRunDir(t)
	g := &restartingGateway{fakeGateway: newFakeGateway("gw"), reexeced: make(chan struct{}), writeBack: []uint64{4096, 1 << 20, 3 << 20}}
	serveRestarting(t, dir, "gw", g)
	c, err := Dial(context.Background(), dir, "gw")
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Restart(context.Background(), RestartOptions{}, nil)
	if err != nil || res.WrittenBackBytes != 3<<20 {
		t.Fatalf("restart: %+v, %v; want %d bytes written back", res, err, 3<<20)
	}
	<-g.reexeced // the re-exec step runs after the answer (a hang here fails the test by timeout)
}

func TestRestartFailedFlushKeepsServing(t *testing.T) {
	dir := testRunDir(t)
	g := &restartingGateway{fakeGateway: newFakeGateway("gw"), flushErr: errors.New("write-back failed: target gone"), reexeced: make(chan struct{})}
	serveRestarting(t, dir, "gw", g)
	c, err := Dial(context.Background(), dir, "gw")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Restart(context.Background(), RestartOptions{}, nil); err == nil || ExitCode(err) != 1 {
		t.Fatalf("restart with a failed flush: %v (exit %d), want an error and exit 1", err, ExitCode(err))
	}
	if _, err := c.Status(context.Background()); err != nil {
		t.Fatalf("the gateway stopped serving after a failed restart: %v", err)
	}
	select {
	case <-g.reexeced:
		t.Fatal("re-executed after a failed flush")
	default:
	}
}

func TestRestartUnsupported(t *testing.T) {
	dir := testRunDir(t)
	serveInProcess(t, dir, "plain", newFakeGateway("plain"), Options{})
	c, err := Dial(context.Background(), dir, "plain")
	if err != nil {
		t.Fatal(err)
	}
	var e *Error
	if _, err := c.Restart(context.Background(), RestartOptions{}, nil); !errors.As(err, &e) || e.Code != CodeUnsupported {
		t.Fatalf("restart of a gateway without it: %v", err)
	}
}

func TestRestartTimeoutKeepsServing(t *testing.T) {
	dir := testRunDir(t)
	g := &restartingGateway{fakeGateway: newFakeGateway("gw"), stuck: true, reexeced: make(chan struct{})}
	serveRestarting(t, dir, "gw", g)
	c, err := Dial(context.Background(), dir, "gw")
	if err != nil {
		t.Fatal(err)
	}
	var e *Error
	_, err = c.Restart(context.Background(), RestartOptions{Timeout: 50 * time.Millisecond}, nil)
	if !errors.As(err, &e) || e.Code != CodeTimeout || ExitCode(err) != 1 {
		t.Fatalf("restart past its timeout: %v (exit %d), want a timeout error and exit 1", err, ExitCode(err))
	}
	if _, err := c.Status(context.Background()); err != nil {
		t.Fatalf("the gateway stopped serving after a restart timed out: %v", err)
	}
}
