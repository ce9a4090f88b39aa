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

// fakeTarget stands in for an iSCSI LUN: an in-memory device that records its Close.
type fakeTarget struct {
	*memdev.Device
	closed int
}

func (f *fakeTarget) Close() error { f.closed++; return f.Device.Close() }

// useFakeTargets makes Open's iSCSI targets in-memory devices for the test's duration; it
// returns the options each open was given and the devices it made.
func useFakeTargets(t *testing.T) (opts *[]iser.Options, made *[]*fakeTarget) {
	t.Helper()
	opts, made = new([]iser.Options), new([]*fakeTarget)
	saved := openISER
	openISER = func(_ context.Context, _ string, o iser.Options) (block.Device, error) {
		d, err := memdev.ParseURL("mem://32MiB")
		if err != nil {
			return nil, err
		}
		*opts = append(*opts, o)
		f := &fakeTarget{Device: d}
		*made = append(*made, f)
		return f, nil
	}
	t.Cleanup(func() { openISER = saved })
	return opts, made
}

const (
	lunA = "iscsi://127.0.0.1:1/iqn.2026-12.test:a/0"
	lunB = "iscsi://127.0.0.1:1/iqn.2026-12.test:b/0"
)

// TestTargetOpenedAsConfigured: the backend gets the read-only setting and the other portals, and
// the cache stages its I/O in the caller's pool.
func TestTargetOpenedAsConfigured(t *testing.T) {
	opts, _ := useFakeTargets(t)
	p := newPool(t)
	cfg := Config{Target: lunA, Alternates: []string{"iscsi://127.0.0.2:1/iqn.2026-12.test:a/0"}, ReadOnly: true,
		Cache: cacheConfig(t, "writeback"), TargetOptions: func(string) (iser.Options, error) { return iser.Options{}, nil }}
	dev, err := Open(context.Background(), cfg, p)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	if len(*opts) != 1 || !(*opts)[0].ReadOnly || len((*opts)[0].AlternateTargets) != 1 || (*opts)[0].AlternateTargets[0] != cfg.Alternates[0] {
		t.Fatalf("target opened with %+v, want read-only and the alternate portal", *opts)
	}
	before := p.Stats().Gets
	if err := dev.ReadAt(context.Background(), make([]byte, 4096), 1<<20); err != nil {
		t.Fatal(err)
	}
	if p.Stats().Gets == before {
		t.Fatal("a read miss took no staging buffer from the caller's pool")
	}
}

// TestFailureClosesTarget: when a layer above the target fails, Open closes the target it opened.
func TestFailureClosesTarget(t *testing.T) {
	login := func(string) (iser.Options, error) { return iser.Options{}, nil }
	t.Run("the cache", func(t *testing.T) {
		_, made := useFakeTargets(t)
		ccfg := cacheConfig(t, "writeback")
		ccfg.Size = 16 << 10 // fewer than 16 pages: cache.New refuses it
		if _, err := Open(context.Background(), Config{Target: lunA, Cache: ccfg, TargetOptions: login}, newPool(t)); err == nil {
			t.Fatal("Open of a cache too small succeeded")
		}
		if len(*made) != 1 || (*made)[0].closed != 1 {
			t.Fatalf("targets opened %d, closed %v; want one, closed once", len(*made), *made)
		}
	})
	t.Run("the cache device", func(t *testing.T) {
		_, made := useFakeTargets(t)
		cd := &cachedev.Options{Path: filepath.Join(t.TempDir(), "no-such-dir", "log"), NewSize: 16 << 20}
		if _, err := Open(context.Background(), Config{Target: lunA, Cache: cacheConfig(t, "writeback"), CacheDev: cd, TargetOptions: login}, newPool(t)); err == nil {
			t.Fatal("Open with a cache device that cannot be created succeeded")
		}
		if len(*made) != 1 || (*made)[0].closed != 1 {
			t.Fatalf("targets opened %d, closed %v; want one, closed once", len(*made), *made)
		}
	})
}

// TestCacheDevNamesItsLUN: the cache device records the LUN it caches, so another LUN's gateway
// is refused it rather than served that LUN's data.
func TestCacheDevNamesItsLUN(t *testing.T) {
	useFakeTargets(t)
	path := filepath.Join(t.TempDir(), "log")
	open := func(target string) (block.Device, error) {
		return Open(context.Background(), Config{Target: target, Cache: cacheConfig(t, "writeback"),
			CacheDev:      &cachedev.Options{Path: path, NewSize: 16 << 20},
			TargetOptions: func(string) (iser.Options, error) { return iser.Options{}, nil }}, newPool(t))
	}
	dev, err := open(lunA)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, dev)
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	if dev, err := open(lunB); err == nil {
		dev.Close()
		t.Fatal("LUN b's gateway was given LUN a's cache device")
	}
	dev, err = open(lunA)
	if err != nil {
		t.Fatalf("LUN a's own cache device refused: %v", err)
	}
	dev.Close()
}
