package main

// serve: expose the target as an NBD export on a unix or TCP socket (frontend/nbd), for qemu,
// libnbd tools, nbdfuse, fio's nbd engine or a remote nbd-client. Shutdown on SIGINT/SIGTERM:
// stop accepting, let in-flight requests finish, flush the device, close it (log out).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache"
	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/pool"
)

func init() {
	register(&command{name: "serve", summary: "serve the LUN as an NBD export on a socket", run: runServe})
}

// exportFlags are the flags shared by serve and attach that shape the device and its NBD export.
type exportFlags struct {
	target       string
	alternates   []string // --target given again: the same IQN/LUN on other portals
	exportName   string
	readOnly     bool
	maxInflight  int
	bufferMemory string
	splice       bool
	cache        cacheFlags
}

func (ef *exportFlags) register(fs *flag.FlagSet) {
	fs.Var((*targetList)(ef), "target", "target URL: iscsi://[user@]host[:port]/IQN/LUN, iser://..., or mem://SIZE (test-only in-memory device);\n"+
		"repeat it with the same IQN/LUN on other portals for multipath (failover and fail-back)")
	fs.StringVar(&ef.exportName, "export-name", "iser-blk", "NBD export name (the empty default name also selects it)")
	fs.BoolVar(&ef.readOnly, "read-only", false, "export read-only")
	fs.IntVar(&ef.maxInflight, "max-inflight", 128, "requests executing concurrently per connection")
	fs.StringVar(&ef.bufferMemory, "buffer-memory", "512MiB", "bound on the registered buffer pool (mapped lazily)")
	fs.BoolVar(&ef.splice, "splice", false, "splice large READ payloads from the iSCSI socket to the NBD socket instead of\n"+
		"copying them through memory (cache off, iSCSI/TCP only); saves the gateway's CPU,\n"+
		"but a target on the same host may spend more than that (see docs/bench)")
	ef.cache.register(fs)
}

// openStack builds what serve and attach share: the registered buffer pool (--buffer-memory,
// mem bytes), the target (--target) and the cache (--cache) in front of it, staging its I/O in
// the pool. The caller closes the device first (closeDevice) and the pool last.
func openStack(ctx context.Context, tf *targetFlags, ef *exportFlags, log *zap.Logger) (dev block.Device, p *pool.Pool, mem int64, err error) {
	if _, err := cache.ParseConfig(ef.cache.mode, ef.cache.size, ef.cache.dirty); err != nil {
		return nil, nil, 0, usagef("%v", err) // before logging in, so a typo costs no session
	}
	if p, mem, err = newBufferPool(ef); err != nil {
		return nil, nil, 0, err
	}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	// iSER connections register the pool's regions once and hand its buffers (NBD payloads,
	// cache staging) to the target without a copy; without RDMA this does nothing.
	if err = iser.UsePool(p); err != nil {
		return nil, nil, 0, fmt.Errorf("registering the buffer pool for RDMA: %w", err)
	}
	target, err := openTarget(ctx, tf, ef, log)
	if err != nil {
		return nil, nil, 0, err
	}
	if dev, err = ef.cache.wrap(target, p, log); err != nil {
		target.Close()
		return nil, nil, 0, err
	}
	return dev, p, mem, nil
}

// openTarget opens --target as a block.Device. mem:// is an in-memory device for tests and
// protocol benchmarks; everything else goes to the iSCSI/iSER backend.
func openTarget(ctx context.Context, tf *targetFlags, ef *exportFlags, log *zap.Logger) (block.Device, error) {
	if ef.target == "" {
		return nil, usagef("--target is required")
	}
	if strings.HasPrefix(ef.target, "mem://") {
		d, err := memdev.ParseURL(ef.target)
		if err != nil {
			return nil, usagef("%v", err)
		}
		return d, nil
	}
	t, err := iser.ParseURL(ef.target)
	if err != nil {
		return nil, err
	}
	opts, err := tf.options(t.User, log)
	if err != nil {
		return nil, err
	}
	opts.ReadOnly = ef.readOnly
	opts.AlternateTargets = ef.alternates
	return iser.Open(ctx, ef.target, opts)
}

// targetList is --target: the first names the LUN, later ones the same LUN on other portals.
type targetList exportFlags

func (l *targetList) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(append([]string{l.target}, l.alternates...), ",")
}

func (l *targetList) Set(v string) error {
	if l.target == "" {
		l.target = v
		return nil
	}
	if strings.HasPrefix(v, "mem://") || strings.HasPrefix(l.target, "mem://") {
		return fmt.Errorf("mem:// cannot have several portals")
	}
	l.alternates = append(l.alternates, v)
	return nil
}

// newBufferPool builds the registered-memory buffer pool from --buffer-memory.
func newBufferPool(ef *exportFlags) (*pool.Pool, int64, error) {
	mem, err := humanize.ParseBytes(ef.bufferMemory)
	if err != nil || mem < 2*nbd.MaxPayload || mem > 1<<40 {
		return nil, 0, usagef("--buffer-memory %q: need a size of at least %s", ef.bufferMemory, humanize.IBytes(2*nbd.MaxPayload))
	}
	p, err := pool.New(pool.Config{MaxBytes: int64(mem), HugePages: true})
	if err != nil {
		return nil, 0, fmt.Errorf("buffer pool: %w", err)
	}
	return p, int64(mem), nil
}

// newExportServer builds the NBD server for dev, its payloads in p (of mem bytes).
func newExportServer(dev block.Device, ef *exportFlags, p *pool.Pool, mem int64, log *zap.Logger) (*nbd.Server, error) {
	srv, err := nbd.NewServer(dev, nbd.Options{
		ExportName:    ef.exportName,
		Description:   "iser-blk " + redactURL(ef.target),
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

// redactURL drops the user part of a target URL for display.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(target)"
	}
	u.User = nil
	return u.String()
}

// listenSpec opens the --listen address: unix:///path (default) or tcp://host:port.
func listen(spec string, log *zap.Logger) (net.Listener, string, error) {
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
		log.Warn("NBD over TCP has no authentication or encryption; anyone who can reach the port can read and write the disk",
			zap.String("address", l.Addr().String()))
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
	fs := newFlagSet("serve", "--target URL [--listen unix:///PATH|tcp://HOST:PORT] [flags]",
		"Serve the LUN as an NBD export (fixed newstyle, structured replies, FLUSH/FUA/TRIM/\n"+
			"WRITE_ZEROES, multi-conn) until SIGINT/SIGTERM. Prints the NBD URI on stdout once listening.\n"+
			"Connect with e.g. nbdinfo, nbdcopy, qemu-img or fio --ioengine=nbd.")
	tf.register(fs, true)
	ef.register(fs)
	fs.StringVar(&listenSpec, "listen", "unix:///run/iser-blk.sock", "where to listen: unix:///PATH (mode 0600) or tcp://HOST:PORT")
	fs.DurationVar(&drain, "drain-timeout", time.Minute, "at shutdown, how long in-flight requests may take before connections are cut")
	if _, code, done := parseOrExit(fs, args, 0); done {
		return code
	}
	log := newLogger(tf.debug)
	defer log.Sync() //nolint:errcheck

	dev, p, mem, err := openStack(ctx, &tf, &ef, log)
	if err != nil {
		return fail("serve", err)
	}
	defer p.Close()
	srv, err := newExportServer(dev, &ef, p, mem, log)
	if err != nil {
		dev.Close()
		return fail("serve", err)
	}
	l, uri, err := listen(listenSpec, log)
	if err != nil {
		dev.Close()
		return fail("serve", err)
	}
	log.Info("serving NBD", zap.String("uri", uri), zap.String("export", ef.exportName),
		zap.String("size", humanize.IBytes(uint64(dev.Size()))), zap.Int("block_size", dev.BlockSize()),
		zap.Uint16("flags", srv.Flags()))
	fmt.Println(uri)

	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
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
	if c := closeDevice(dev, log); c != exitOK {
		code = c
	}
	return code
}
