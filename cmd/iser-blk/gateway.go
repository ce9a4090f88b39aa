package main

// The wiring of a serving command's gateway (internal/gateway): flags to options.

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/internal/buildinfo"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/gateway"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/service"
	"github.com/iser-blk/iser-blk/internal/status"
)

// serviceFlags are --name, --run-dir and --metrics-listen, shared by serve and attach.
type serviceFlags struct {
	name, runDir, metricsListen string
}

func (sf *serviceFlags) register(fs *pflag.FlagSet, nameDefault string) {
	fs.StringVar(&sf.name, "name", "", "the gateway's name, unique on the host (default: "+nameDefault+")")
	fs.StringVar(&sf.runDir, "run-dir", "", "directory of the control sockets (default: $"+control.RunDirEnv+" or "+control.DefaultRunDir+")")
	fs.StringVar(&sf.metricsListen, "metrics-listen", "", "serve Prometheus /metrics on this HOST:PORT (default: off)")
}

// startGateway claims the name (--name, else id's) and starts the gateway. counters are the
// frontend's I/O counters, created once and handed to the frontend too; stop ends the context
// the frontend serves under.
func startGateway(sf *serviceFlags, id status.Identity, counters *status.IOCounters, stop context.CancelFunc, log *zap.Logger) (*gateway.Gateway, error) {
	if sf.name != "" {
		id.Name, id.Device = sf.name, sf.name
	}
	id.BuildVersion = buildinfo.Version()
	return gateway.Start(gateway.Options{
		Service:      service.Options{RunDir: sf.runDir, Identity: id, MetricsListen: sf.metricsListen},
		Counters:     counters,
		StopFrontend: stop,
		Log:          log,
	})
}

// identity is what a gateway serving target through frontend kind at path reports.
func identity(name string, kind modes.Frontend, path string, ef *exportFlags) status.Identity {
	targets := []string{iser.RedactURL(ef.target)}
	for _, t := range ef.alternates {
		targets = append(targets, iser.RedactURL(t))
	}
	mode, _ := modes.ParseCache(ef.cache.Mode) // a bad --cache stops openStack before anything serves
	return status.Identity{Name: name, Device: name, FrontendKind: kind, FrontendPath: path, Targets: targets, CacheMode: mode}
}

// signalContext returns a context cancelled by the first SIGINT or SIGTERM. The second one is
// caught by the final flush (gateway.CloseDevice), which listens for it itself to abort.
func signalContext() (context.Context, func()) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}
