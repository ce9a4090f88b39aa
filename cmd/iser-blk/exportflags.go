package main

// The flags serve and attach share that shape the device stack and its NBD export.

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/internal/gateway"
	"github.com/iser-blk/iser-blk/internal/status"
	"github.com/iser-blk/iser-blk/pool"
)

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

// registerTarget adds --target (the Target group).
func (ef *exportFlags) registerTarget(fs *pflag.FlagSet) {
	fs.Var((*targetList)(ef), "target", "target URL: iscsi://[user@]host[:port]/IQN/LUN or iser://...; repeat it with the same\n"+
		"IQN/LUN on other portals for multipath (failover and fail-back)")
}

// registerExport adds the flags that shape the device and its NBD export (attach hides
// --export-name: the kernel's NBD client never names an export).
func (ef *exportFlags) registerExport(fs *pflag.FlagSet) {
	fs.StringVar(&ef.exportName, "export-name", "iser-blk", "NBD export name (the empty default name also selects it)")
	fs.BoolVar(&ef.readOnly, "read-only", false, "export read-only")
	fs.IntVar(&ef.maxInflight, "max-inflight", 128, "requests executing concurrently per connection")
	fs.StringVar(&ef.bufferMemory, "buffer-memory", "512MiB", "bound on the registered buffer pool (mapped lazily)")
	fs.BoolVar(&ef.splice, "splice", false, "splice large READ payloads from the iSCSI socket to the NBD socket instead of\n"+
		"copying them through memory (cache off, iSCSI/TCP only); saves the gateway's CPU,\n"+
		"but a target on the same host may spend more than that (see docs/bench)")
}

// targetList is --target: the first names the LUN, later ones the same LUN on other portals.
type targetList exportFlags

func (l *targetList) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(append([]string{l.target}, l.alternates...), ",")
}

// Type is the value's name in help: --target URL.
func (l *targetList) Type() string { return "URL" }

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

// nbdExport is the NBD server's settings: the export flags and the stack's buffer pool p.
func (ef *exportFlags) nbdExport(p *pool.Pool, counters *status.IOCounters, log *zap.Logger) *gateway.NBDExport {
	return &gateway.NBDExport{Name: ef.exportName, Target: ef.target, ReadOnly: ef.readOnly, Splice: ef.splice,
		MaxInflight: ef.maxInflight, Pool: p, Counters: counters, Log: log}
}
