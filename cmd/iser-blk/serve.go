package main

// serve: expose the target as an NBD export on a unix or TCP socket (frontend/nbd), for qemu,
// libnbd tools, nbdfuse, fio's nbd engine or a remote nbd-client. Shutdown on SIGINT/SIGTERM:
// stop accepting, let in-flight requests finish, flush the device, close it (log out).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/internal/status"
	"github.com/iser-blk/iser-blk/pool"
)

func init() {
	register(&command{name: "serve", summary: "serve the LUN as an NBD export on a socket", run: runServe})
}

// newExportServer builds the NBD server for dev, its payloads in p (of mem bytes).
func newExportServer(dev block.Device, ef *exportFlags, p *pool.Pool, mem int64, counters *status.IOCounters, log *zap.Logger) (*nbd.Server, error) {
	srv, err := nbd.NewServer(dev, nbd.Options{
		Counters:      counters,
		ExportName:    ef.exportName,
		Description:   "iser-blk " + iser.RedactURL(ef.target),
		Pool:          p,
		MaxInflight:   ef.maxInflight,
		Logger:        log,
		ForceReadOnly: ef.readOnly,
		Splice:        ef.splice,
		// Three quarters of the pool: size-class rounding never leaves a reserved request
		// without buffers.
		PayloadBudget: mem * 3 / 4,
	})
	if err != nil {
		return nil, err
	}
	return srv, nil
}

// listen opens the --listen address: unix:///path (default) or tcp://host:port.
func listen(spec string) (net.Listener, string, error) {
	u, err := url.Parse(spec)
	if err != nil {
		return nil, "", usagef("--listen %q: %v", spec, err)
	}
	switch u.Scheme {
	case "unix":
		path := u.Path
		if path == "" {
			return nil, "", usagef("--listen %q: no socket path", spec)
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
			return nil, "", usagef("--listen %q: need tcp://host:port", spec)
		}
		l, err := net.Listen("tcp", u.Host)
		if err != nil {
			return nil, "", fmt.Errorf("listen on %s: %w", u.Host, err)
		}
		return l, "nbd://" + l.Addr().String() + "/", nil
	default:
		return nil, "", usagef("--listen %q: scheme must be unix:// or tcp://", spec)
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
		return usagef("%s exists and is not a socket; not removing it", path)
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

func runServe(ctx context.Context, args []string) int {
	var tf targetFlags
	var ef exportFlags
	var listenSpec string
	var drain time.Duration
	var tlsf tlsFlags
	var sf serviceFlags
	fs := newFlagSet("serve", "--target URL [--listen unix:///PATH|tcp://HOST:PORT] [flags]",
		"Serve the LUN as an NBD export (fixed newstyle, structured replies, FLUSH/FUA/TRIM/\n"+
			"WRITE_ZEROES, multi-conn) until SIGINT/SIGTERM. Prints the NBD URI on stdout once listening.\n"+
			"Connect with e.g. nbdinfo, nbdcopy, qemu-img or fio --ioengine=nbd.")
	tf.register(fs, true)
	ef.register(fs)
	tlsf.register(fs)
	fs.StringVar(&listenSpec, "listen", "unix:///run/iser-blk.sock", "where to listen: unix:///PATH (mode 0600) or tcp://HOST:PORT")
	fs.DurationVar(&drain, "drain-timeout", time.Minute, "at shutdown, how long in-flight requests may take before connections are cut")
	sf.register(fs, "the --listen socket's base name without extension, or nbd-tcp-PORT")
	if _, code, done := parseOrExit(fs, args, 0); done {
		return code
	}
	log := newLogger(tf.debug)
	defer log.Sync() //nolint:errcheck
	tlsPolicy, err := tlsf.serverTLS(ctx, listenSpec, log)
	if err != nil {
		return fail("serve", err)
	}
	name, where, err := serveIdentity(listenSpec)
	if err != nil {
		return fail("serve", err)
	}
	// The name is claimed before logging in: a second gateway by that name costs no session.
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	counters := new(status.IOCounters)
	g, err := startGateway(&sf, identity(name, "nbd-socket", where, &ef), counters, stop, log)
	if err != nil {
		return fail("serve", err)
	}
	dev, p, mem, err := openStack(ctx, &tf, &ef, log)
	if err != nil {
		g.Abandon()
		return fail("serve", err)
	}
	defer p.Close()
	srv, err := newExportServer(dev, &ef, p, mem, counters, log)
	if err != nil {
		dev.Close()
		g.Abandon()
		return fail("serve", err)
	}
	l, uri, err := listen(listenSpec)
	if err != nil {
		dev.Close()
		g.Abandon()
		return fail("serve", err)
	}
	g.Serving(dev, "", status.Frontend{Kind: "nbd-socket", QueueDepth: ef.maxInflight})
	uri = tlsf.options(listenSpec, log).URI(uri)
	log.Info("serving NBD", zap.String("uri", uri), zap.String("export", ef.exportName),
		zap.String("size", humanize.IBytes(uint64(dev.Size()))), zap.Int("block_size", dev.BlockSize()),
		zap.Uint16("flags", srv.Flags()))
	fmt.Println(uri)
	g.Ready()

	served := make(chan error, 1)
	go func() { served <- serveNBD(srv, l, tlsPolicy) }()
	code := exitOK
	select {
	case <-ctx.Done():
		log.Info("shutting down: draining in-flight requests")
	case err := <-served:
		log.Error("NBD listener failed", zap.Error(err))
		code = exitFailure
	}
	sctx, cancel := context.WithTimeout(context.Background(), drain)
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("connections cut before their requests finished", zap.Error(err))
	}
	cancel()
	return g.Shutdown(code, nil)
}

// serveIdentity is serve's default gateway name and the frontend path status shows for the
// --listen spec: a unix socket's base name without extension and its path, or nbd-tcp-PORT and
// host:port for TCP (a port is unique on the host, like a name must be); for port 0, which the
// kernel picks only after the name is claimed, nbd-tcp-pidPID.
func serveIdentity(spec string) (name, where string, err error) {
	u, err := url.Parse(spec)
	if err != nil {
		return "", "", usagef("--listen %q: %v", spec, err)
	}
	if u.Scheme == "tcp" {
		if u.Port() == "0" {
			return fmt.Sprintf("nbd-tcp-pid%d", os.Getpid()), u.Host, nil
		}
		return "nbd-tcp-" + u.Port(), u.Host, nil
	}
	base := filepath.Base(u.Path)
	return strings.TrimSuffix(base, filepath.Ext(base)), u.Path, nil
}
