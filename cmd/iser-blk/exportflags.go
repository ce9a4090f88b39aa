package main

// The flags serve and attach share that shape the device stack and its NBD export.

import (
	"flag"
	"fmt"
	"strings"
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
