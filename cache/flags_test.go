package cache_test

import (
	"testing"

	"github.com/iser-blk/iser-blk/cache"
)

// TestFlags: the cutoffs are sizes where 0 turns one off (-1) and "" is the default; a cutoff
// that is not a size is refused naming its flag; the other flags are ParseConfig's.
func TestFlags(t *testing.T) {
	cfg, err := cache.Flags{Mode: "wt", Size: "64MiB", Dirty: "25%", WriteAround: "0", ReadAround: "1MiB"}.Config()
	if err != nil || cfg.Mode != cache.WriteThrough || cfg.Size != 64<<20 || cfg.DirtyLimit != 16<<20 ||
		cfg.WriteAround != -1 || cfg.ReadAround != 1<<20 {
		t.Fatalf("%v %+v", err, cfg)
	}
	if cfg, err := (cache.Flags{}).Config(); err != nil || cfg.WriteAround != 0 || cfg.ReadAround != 0 {
		t.Fatalf("defaults: %v %+v", err, cfg)
	}
	for _, f := range []cache.Flags{{ReadAround: "lots"}, {WriteAround: "2TiB"}, {Mode: "fast"}} {
		if _, err := f.Config(); err == nil {
			t.Errorf("%+v accepted", f)
		}
	}
	if _, err := (cache.Flags{ReadAround: "lots"}).Config(); err == nil || err.Error() != `--cache-read-around "lots": want a size` {
		t.Errorf("bad cutoff: %v", err)
	}
}
