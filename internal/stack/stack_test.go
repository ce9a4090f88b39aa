package stack

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache"
	"github.com/iser-blk/iser-blk/internal/cachedev"
	"github.com/iser-blk/iser-blk/pool"
)

func newPool(t *testing.T) *pool.Pool {
	t.Helper()
	p, err := pool.New(pool.Config{MaxBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func cacheConfig(t *testing.T, mode string) cache.Config {
	t.Helper()
	cfg, err := cache.ParseConfig(mode, "8MiB", "50%")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// roundTrip writes a block, flushes and reads it back through dev.
func roundTrip(t *testing.T, dev block.Device) {
	t.Helper()
	ctx := context.Background()
	data := bytes.Repeat([]byte{0xa5}, 4096)
	if err := dev.WriteAt(ctx, data, 8192, 0); err != nil {
		t.Fatal(err)
	}
	if err := dev.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if err := dev.ReadAt(ctx, got, 8192); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %v, equal %v", err, bytes.Equal(got, data))
	}
}

// TestOpenLayers: each configuration puts the layers it names, and only those, over the backend.
func TestOpenLayers(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mode     string
		cacheDev bool
		top      func(block.Device) bool
	}{
		{"cache off: the backend itself", "off", false, func(d block.Device) bool { _, ok := d.(*memdev.Device); return ok }},
		{"writeback: the RAM cache", "writeback", false, func(d block.Device) bool {
			c, ok := d.(*cache.Cache)
			return ok && c.Mode() == cache.WriteBack
		}},
		{"writethrough: the RAM cache", "writethrough", false, func(d block.Device) bool {
			c, ok := d.(*cache.Cache)
			return ok && c.Mode() == cache.WriteThrough
		}},
		{"cache-dev: a write-through RAM cache over the log", "writeback", true, func(d block.Device) bool {
			c, ok := d.(*cache.Cache)
			return ok && c.Mode() == cache.WriteThrough
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Target: "mem://32MiB", Cache: cacheConfig(t, tc.mode), Log: zap.NewNop()}
			logPath := filepath.Join(t.TempDir(), "cache-dev")
			if tc.cacheDev {
				cfg.CacheDev = &cachedev.Options{Path: logPath, NewSize: 16 << 20, Log: zap.NewNop()}
			}
			dev, err := Open(context.Background(), cfg, newPool(t))
			if err != nil {
				t.Fatal(err)
			}
			if !tc.top(dev) {
				t.Fatalf("top of the stack is %T", dev)
			}
			if dev.Size() != 32<<20 {
				t.Fatalf("size %d, want the backend's %d", dev.Size(), 32<<20)
			}
			roundTrip(t, dev)
			if err := dev.Close(); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(logPath)
			if tc.cacheDev != (err == nil) {
				t.Fatalf("cache-dev file: %v (want one: %v)", err, tc.cacheDev)
			}
			if tc.cacheDev && fi.Size() != 16<<20 {
				t.Fatalf("cache-dev file of %d bytes, want --cache-dev-size's %d", fi.Size(), 16<<20)
			}
		})
	}
}

// TestConfigRefusedBeforeLogin: a Config mistake is a ConfigError and opens nothing: no login
// options are built, so no session is attempted.
func TestConfigRefusedBeforeLogin(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no target", Config{Cache: cacheConfig(t, "off")}},
		{"cache-dev without write-back", Config{Target: "iscsi://127.0.0.1:1/iqn.2026-12.test:t/0", Cache: cacheConfig(t, "writethrough"),
			CacheDev: &cachedev.Options{Path: filepath.Join(t.TempDir(), "c")}}},
		{"cache-dev with the cache off", Config{Target: "iscsi://127.0.0.1:1/iqn.2026-12.test:t/0", Cache: cacheConfig(t, "off"),
			CacheDev: &cachedev.Options{Path: filepath.Join(t.TempDir(), "c")}}},
		{"mem:// of no size", Config{Target: "mem://0", Cache: cacheConfig(t, "off")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logins := 0
			tc.cfg.Log = zap.NewNop()
			tc.cfg.TargetOptions = func(string) (iser.Options, error) { logins++; return iser.Options{}, nil }
			dev, err := Open(context.Background(), tc.cfg, newPool(t))
			var ce *ConfigError
			if !errors.As(err, &ce) || dev != nil {
				t.Fatalf("Open = %v, %v; want a ConfigError", dev, err)
			}
			if logins != 0 {
				t.Fatalf("login options built %d times for a refused Config", logins)
			}
			if tc.cfg.CacheDev != nil {
				if _, err := os.Stat(tc.cfg.CacheDev.Path); !os.IsNotExist(err) {
					t.Fatalf("the cache device was created: %v", err)
				}
			}
		})
	}
}

// TestTargetOptions: an iSCSI target's login options are built for the URL's user, and their
// error ends Open.
func TestTargetOptions(t *testing.T) {
	refused := errors.New("no secret for alice")
	var user string
	cfg := Config{Target: "iscsi://alice@127.0.0.1:1/iqn.2026-12.test:t/0", Cache: cacheConfig(t, "writeback"), Log: zap.NewNop(),
		TargetOptions: func(u string) (iser.Options, error) { user = u; return iser.Options{}, refused }}
	if _, err := Open(context.Background(), cfg, newPool(t)); !errors.Is(err, refused) {
		t.Fatalf("Open = %v, want the options' error", err)
	}
	if user != "alice" {
		t.Fatalf("options built for user %q, want the URL's alice", user)
	}
	cfg.Target = "iscsi://127.0.0.1:1/not-an-iqn"
	if _, err := Open(context.Background(), cfg, newPool(t)); !errors.Is(err, iser.ErrBadURL) {
		t.Fatalf("Open of a bad URL = %v, want iser.ErrBadURL", err)
	}
}
