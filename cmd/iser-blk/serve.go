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
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/internal/cli"
	"github.com/iser-blk/iser-blk/internal/gateway"
	"github.com/iser-blk/iser-blk/internal/logging"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/status"
	"github.com/iser-blk/iser-blk/pool"
)

// listen opens the --listen address (nbd.Listen): unix:///path (default) or tcp://host:port. A
// spec it cannot use, and a file in the socket's place, are usage errors.
func listen(spec string) (net.Listener, string, error) {
	l, uri, err := nbd.Listen(spec)
	var se *nbd.SpecError
	switch {
	case errors.As(err, &se):
		return nil, "", usagef("--listen %q: %s", spec, se.Reason)
	case errors.Is(err, nbd.ErrNotSocket):
		return nil, "", usagef("%v", err)
	}
	return l, uri, err
}

// serveFlags are serve's flags.
type serveFlags struct {
	tf         targetFlags
	ef         exportFlags
	listenSpec string
	drain      time.Duration
	tlsf       tlsFlags
	sf         serviceFlags
}

// newServeCmd is `iser-blk serve`.
func newServeCmd() *cobra.Command {
	var f serveFlags
	cmd := cli.Leaf("serve --target URL [--listen unix:///PATH|tcp://HOST:PORT] [flags]",
		"serve the LUN as an NBD export on a socket",
		"Serve the LUN as an NBD export (fixed newstyle, structured replies, FLUSH/FUA/TRIM/\n"+
			"WRITE_ZEROES, multi-conn) until SIGINT/SIGTERM. Prints the NBD URI on stdout once listening.\n"+
			"Connect with e.g. nbdinfo, nbdcopy, qemu-img or fio --ioengine=nbd.", 0,
		func(cmd *cobra.Command, _ []string) int { return runServe(cmd.Context(), &f) })
	cli.Group(cmd, groupTarget, func(fs *pflag.FlagSet) {
		f.ef.registerTarget(fs)
		f.tf.register(fs, true)
	})
	cli.Group(cmd, groupReliability, f.tf.registerReliability)
	cli.Group(cmd, groupServer, func(fs *pflag.FlagSet) {
		fs.StringVar(&f.listenSpec, "listen", "unix:///run/iser-blk.sock", "where to listen: unix:///PATH (mode 0600) or tcp://HOST:PORT")
		fs.DurationVar(&f.drain, "drain-timeout", time.Minute, "at shutdown, how long in-flight requests may take before connections are cut")
	})
	cli.Group(cmd, groupExport, f.ef.registerExport)
	cli.Group(cmd, groupTLS, f.tlsf.register)
	cli.Group(cmd, groupCache, f.ef.cache.register)
	cli.Group(cmd, groupService, func(fs *pflag.FlagSet) {
		f.sf.register(fs, "the --listen socket's base name without extension, or nbd-tcp-PORT")
	})
	f.tf.registerDebug(cmd.Flags())
	cli.CompleteFiles(cmd, "chap-secret-file", "target-secret-file")
	cli.CompleteDirs(cmd, "run-dir", "tls-certificates")
	cli.CompleteWords(cmd, "tls", "off", "on", "require")
	f.ef.cache.complete(cmd)
	return cmd
}

func runServe(ctx context.Context, f *serveFlags) int {
	tf, ef := &f.tf, &f.ef
	log := logging.Process(tf.debug)
	defer log.Sync() //nolint:errcheck
	tlsPolicy, err := f.tlsf.serverTLS(ctx, f.listenSpec, log)
	if err != nil {
		return fail("serve", err)
	}
	name, where, err := serveIdentity(f.listenSpec)
	if err != nil {
		return fail("serve", err)
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	counters := new(status.IOCounters)
	var p *pool.Pool
	defer func() {
		if p != nil {
			p.Close()
		}
	}()
	code, err := gateway.ServeExport(ctx, gateway.ExportOptions{
		Start: func() (*gateway.Gateway, error) {
			return startGateway(&f.sf, identity(name, modes.NBDSocket, where, ef), counters, stop, log)
		},
		Open: func() (dev block.Device, err error) {
			dev, p, err = openStack(ctx, tf, ef, log)
			return dev, err
		},
		Listen: func(dev block.Device) (gateway.Export, error) {
			l, uri, err := listen(f.listenSpec)
			if err != nil {
				return gateway.Export{}, err
			}
			return ef.nbdExport(p, counters, log).OnSocket(dev, gateway.Socket{Listener: l,
				URI: f.tlsf.options(f.listenSpec, log).URI(uri), TLS: tlsPolicy, Drain: f.drain,
				Announce: func(uri string) { fmt.Println(uri) }})
		},
		Frontend: status.Frontend{Kind: modes.NBDSocket, QueueDepth: ef.maxInflight},
	})
	if err != nil {
		return fail("serve", err)
	}
	return code
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
