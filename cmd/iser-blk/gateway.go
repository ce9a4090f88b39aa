package main

// The wiring of a serving command's gateway (internal/gateway) and takeover
// (internal/takeover): flags to options.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/buildinfo"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/gateway"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/service"
	"github.com/iser-blk/iser-blk/internal/statefile"
	"github.com/iser-blk/iser-blk/internal/status"
	"github.com/iser-blk/iser-blk/internal/takeover"
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

// prepareTakeover reads attach --name's state file (nil without --name: no state file). A
// corrupt, foreign or other-kind state stops the attach (exit 7).
func prepareTakeover(sf *serviceFlags, kind modes.Frontend, target string, cf *cacheFlags, dev block.Device, log *zap.Logger) (*takeover.Takeover, error) {
	if sf.name == "" {
		return nil, nil
	}
	mode, err := modes.ParseCache(cf.Mode) // "wb", "none", ...: the state file spells it one way
	if err != nil {
		return nil, usagef("%v", err)
	}
	cacheDev, err := cf.dev.absPath()
	if err != nil {
		return nil, err
	}
	if cacheDev != "" {
		mode = modes.WriteThrough // every acknowledged write is in the log: a crash loses none
	}
	if err := control.ValidateName(sf.name); err != nil {
		return nil, usagef("--name: %v", err)
	}
	dir := control.RunDir(sf.runDir)
	if err := control.EnsureRunDir(dir); err != nil {
		return nil, err
	}
	// The identity is the URL without credentials, the size and the block size. The LUN's VPD
	// 0x83 name (Identity.DeviceID) is left empty: tgtd derives it from the target id and LUN
	// number, so it would refuse a legitimate successor when targets come back in another order
	// and still not tell two LUNs behind one IQN and number apart.
	return takeover.Prepare(takeover.Options{Dir: dir, Name: sf.name, Kind: kind, CacheMode: mode, CacheDev: cacheDev, Log: log,
		LUN: statefile.Identity{Target: iser.RedactURL(target), Size: dev.Size(), BlockSize: dev.BlockSize()}})
}

// failTakeover reports a takeover refused before any device was touched.
func failTakeover(err error) int {
	if errors.Is(err, takeover.ErrNoResume) {
		fmt.Fprintf(os.Stderr, "iser-blk attach: %v\n", err)
		return exitNoResume
	}
	return fail("attach", err)
}

// signalContext returns a context cancelled by the first SIGINT or SIGTERM. The second one is
// caught by the final flush (gateway.CloseDevice), which listens for it itself to abort.
func signalContext() (context.Context, func()) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}
