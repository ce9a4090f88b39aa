package main

import (
	"io"
	"testing"

	"github.com/spf13/pflag"

	"github.com/iser-blk/iser-blk/cache"
	"github.com/iser-blk/iser-blk/internal/memlimit"
)

// TestCacheFlags checks the cache flags' defaults (the size derived from the host's memory, the
// cutoffs at 256 KiB) and that 0 turns a cutoff off.
func TestCacheFlags(t *testing.T) {
	parse := func(args ...string) (cache.Config, error) {
		var cf cacheFlags
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cf.register(fs)
		if err := fs.Parse(args); err != nil {
			return cache.Config{}, err
		}
		return cf.Config()
	}
	cfg, err := parse()
	if err != nil {
		t.Fatal(err)
	}
	if want := cache.SizeFor(memlimit.Own()); cfg.Size != want || cfg.WriteAround != 256<<10 || cfg.ReadAround != 256<<10 {
		t.Fatalf("defaults: size %d (want %d), write-around %d, read-around %d", cfg.Size, want, cfg.WriteAround, cfg.ReadAround)
	}
	cfg, err = parse("--cache-write-around", "0", "--cache-read-around", "1MiB")
	if err != nil || cfg.WriteAround != -1 || cfg.ReadAround != 1<<20 {
		t.Fatalf("cutoffs: %v %+v", err, cfg)
	}
	if _, err := parse("--cache-read-around", "lots"); err == nil {
		t.Fatal("a bad cutoff was accepted")
	}
}
