package nbd

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// brokenListener fails every Accept with a permanent error.
type brokenListener struct{ net.Listener }

var errBroken = errors.New("listener broken")

func (brokenListener) Accept() (net.Conn, error) { return nil, errBroken }

// TestServerServeUntil: ServeUntil returns nil once ctx ends (the listener is closed, so new
// clients are refused), and the listener's error when it fails; either way the server is shut
// down and serves no more.
func TestServerServeUntil(t *testing.T) {
	for _, stopped := range []bool{true, false} {
		core, logs := observer.New(zap.DebugLevel)
		srv, err := NewServer(newMem(t, 1<<20, ""), Options{Logger: zap.New(core)})
		if err != nil {
			t.Fatal(err)
		}
		sock := filepath.Join(t.TempDir(), "nbd.sock")
		var l net.Listener
		if l, err = net.Listen("unix", sock); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		want, msg := error(nil), "shutting down: draining in-flight requests"
		if stopped {
			time.AfterFunc(10*time.Millisecond, cancel)
		} else {
			l = brokenListener{l}
			want, msg = errBroken, "NBD listener failed"
		}
		if err := srv.ServeUntil(ctx, l, nil, time.Second); !errors.Is(err, want) {
			t.Errorf("stopped %v: %v, want %v", stopped, err, want)
		}
		cancel()
		if logs.FilterMessage(msg).Len() != 1 {
			t.Errorf("stopped %v: logged %v, want %q", stopped, logs.All(), msg)
		}
		if c, err := net.Dial("unix", sock); stopped && err == nil {
			c.Close()
			t.Errorf("stopped %v: the listener still accepts", stopped)
		}
		if err := srv.Serve(l); err == nil {
			t.Errorf("stopped %v: the server serves after ServeUntil", stopped)
		}
	}
}

// TestServerServeUntilStoppedBeforeServing: a ctx that ended before Serve took the listener
// still closes it, and a unix socket's file goes with it.
func TestServerServeUntilStoppedBeforeServing(t *testing.T) {
	srv, err := NewServer(newMem(t, 1<<20, ""), Options{})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "nbd.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := srv.ServeUntil(ctx, l, nil, time.Second); err != nil {
		t.Fatalf("ServeUntil: %v", err)
	}
	if _, err := os.Stat(sock); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket file after ServeUntil returned: %v, want it removed", err)
	}
}
