package gateway

// The NBD server a gateway serves its device with: serve's on a socket, attach's to the
// kernel's nbd driver; both are built from the same settings.

import (
	"context"
	"net"
	"time"

	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/internal/status"
	"github.com/iser-blk/iser-blk/pool"
)

// NBDExport are an NBD server's settings besides the device.
type NBDExport struct {
	// Name is the export's name ("": nbd.Options' default).
	Name string
	// Target is the LUN's URL: the export's description shows it without credentials.
	Target string
	// ReadOnly serves the export read-only whatever the device allows.
	ReadOnly bool
	// Splice moves payloads between the socket and the pool with splice (nbd.Options).
	Splice bool
	// MaxInflight bounds the requests served at once per connection.
	MaxInflight int
	// Pool holds the requests' payloads (nil: the heap). The payloads of requests held at once
	// may take three quarters of it: size-class rounding never leaves a reserved request
	// without buffers.
	Pool *pool.Pool
	// Counters count the export's I/O for status (nil: none).
	Counters *status.IOCounters
	// Log is the process's logger (nil: none).
	Log *zap.Logger
}

// Server builds the NBD server for dev.
func (e *NBDExport) Server(dev block.Device) (*nbd.Server, error) {
	return nbd.NewServer(dev, e.options())
}

// options are the server's nbd.Options.
func (e *NBDExport) options() nbd.Options {
	opts := nbd.Options{
		Counters:      e.Counters,
		ExportName:    e.Name,
		Description:   "iser-blk " + iser.RedactURL(e.Target),
		MaxInflight:   e.MaxInflight,
		Logger:        e.Log,
		ForceReadOnly: e.ReadOnly,
		Splice:        e.Splice,
	}
	if e.Pool != nil { // a nil *pool.Pool in the interface would not be nbd's heap default
		opts.Pool = e.Pool
		opts.PayloadBudget = e.Pool.Stats().MaxBytes * 3 / 4
	}
	return opts
}

// Socket is how serve's export meets its clients.
type Socket struct {
	// Listener accepts the clients; OnSocket's export closes it, whether it served or not
	// (nbd.Server.ServeUntil, or OnSocket itself when the server cannot be built).
	Listener net.Listener
	// URI is the NBD URI clients connect to (nbds:// with TLS), logged and announced.
	URI string
	// TLS is the server's TLS policy (nil: plaintext).
	TLS *nbd.TLS
	// Drain is how long requests in flight may take at shutdown before connections are cut.
	Drain time.Duration
	// Announce tells the user the URI once the export listens (nil: only logged).
	Announce func(uri string)
}

// OnSocket is ExportOptions.Listen's export for serve: dev's NBD server (Server) serving
// sock. A server it cannot build closes the listener (a unix socket's file goes with it).
func (e *NBDExport) OnSocket(dev block.Device, sock Socket) (Export, error) {
	srv, err := e.Server(dev)
	if err != nil {
		sock.Listener.Close() //nolint:errcheck // nothing was served on it
		return Export{}, err
	}
	log := e.Log
	if log == nil {
		log = zap.NewNop()
	}
	announce := func() {
		log.Info("serving NBD", zap.String("uri", sock.URI), zap.String("export", e.Name),
			zap.String("size", humanize.IBytes(uint64(dev.Size()))), zap.Int("block_size", dev.BlockSize()),
			zap.Uint16("flags", srv.Flags()))
		if sock.Announce != nil {
			sock.Announce(sock.URI)
		}
	}
	serve := func(ctx context.Context) error { return srv.ServeUntil(ctx, sock.Listener, sock.TLS, sock.Drain) }
	return Export{Serve: serve, Announce: announce}, nil
}
