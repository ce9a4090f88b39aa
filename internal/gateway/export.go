package gateway

// The serve side of a gateway: an NBD export on a socket, named before login and served until
// the context ends.

import (
	"context"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/status"
)

// ExportOptions are serve's steps, which ServeExport takes in the lifecycle's order.
type ExportOptions struct {
	// Start claims the gateway's name and starts it: before login, so that a second gateway by
	// that name costs no session.
	Start func() (*Gateway, error)
	// Open opens the device stack (logs in to the target).
	Open func() (block.Device, error)
	// Listen builds the export of dev and listens.
	Listen func(dev block.Device) (Export, error)
	// Frontend is what status shows of the export.
	Frontend status.Frontend
}

// Export is an export that listens.
type Export struct {
	// Serve runs it until ctx ends and reports whether it failed (the failure is logged where
	// it happened).
	Serve func(ctx context.Context) error
	// Announce tells the user where it is once it accepts connections (nil: nothing).
	Announce func()
}

// ServeExport is serve's whole lifecycle: the name claimed, the stack opened, the export
// listening, the lifecycle at ready; served until ctx ends (a stop signal, a detach); then the
// final flush and close under the lifecycle (Shutdown), whose exit code it returns. A failure
// before the export serves is returned as err, with the device closed (logged out) and the name
// given up; the caller maps it to an exit code.
func ServeExport(ctx context.Context, o ExportOptions) (code int, err error) {
	g, err := o.Start()
	if err != nil {
		return ExitFailure, err
	}
	dev, err := o.Open()
	if err != nil {
		g.Abandon()
		return ExitFailure, err
	}
	exp, err := o.Listen(dev)
	if err != nil {
		_ = dev.Close() // nothing was served: nothing to flush
		g.Abandon()
		return ExitFailure, err
	}
	g.Serving(dev, "", o.Frontend)
	if exp.Announce != nil {
		exp.Announce()
	}
	g.Ready()
	code = ExitOK
	if exp.Serve(ctx) != nil {
		code = ExitFailure
	}
	return g.Shutdown(code, nil), nil
}
