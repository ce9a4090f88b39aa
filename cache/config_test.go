package cache

import (
	"testing"
	"time"
)

// FuzzParseConfig: whatever the flag strings, ParseConfig returns an error or a Config whose
// dirty limit fits in its size, and resolving it never panics.
func FuzzParseConfig(f *testing.F) {
	for _, s := range [][3]string{
		{"writeback", "1GiB", "50%"}, {"writethrough", "64M", "8M"}, {"off", "", ""},
		{"", "1", "100%"}, {"wb", "1.5GiB", "0.5%"}, {"x", "-1", "%"}, {"", "1e3", "1e2%"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, mode, size, dirty string) {
		cfg, err := ParseConfig(mode, size, dirty)
		if err != nil {
			return
		}
		if cfg.Size <= 0 || cfg.DirtyLimit <= 0 || cfg.DirtyLimit > cfg.Size {
			t.Fatalf("ParseConfig(%q, %q, %q) = %+v", mode, size, dirty, cfg)
		}
		if _, err := resolve(cfg, 512, 1<<20); err == nil && cfg.Size < 16*DefaultPageSize {
			t.Fatalf("resolve accepted a %d-byte cache", cfg.Size)
		}
	})
}

func TestResolveDefaults(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     Config
		bs      int
		maxXfer int64
		ok      bool
		check   func(r resolved) bool
	}{
		{"defaults", Config{}, 512, 0, true, func(r resolved) bool {
			return r.PageSize == 4096 && r.spp == 8 && r.maxJob == DefaultWriteBack && r.MaxDirtyAge == DefaultMaxDirtyAge &&
				r.limitPages == (DefaultSize/2)/4096 && r.lowPages >= 2*r.maxJob/4096 && r.lowPages < r.limitPages
		}},
		{"backend max transfer caps write-back", Config{Size: 64 << 20}, 4096, 256 << 10, true, func(r resolved) bool {
			return r.maxJob == 256<<10 && r.spp == 1
		}},
		{"huge max transfer capped", Config{Size: 64 << 20}, 4096, 64 << 20, true, func(r resolved) bool {
			return r.maxJob == maxWriteBackCap
		}},
		{"big blocks get big pages", Config{Size: 64 << 20}, 8192, 0, true, func(r resolved) bool {
			return r.PageSize == 8192 && r.spp == 1
		}},
		{"explicit low water clamped below the limit", Config{Size: 1 << 20, DirtyLimit: 64 << 10, LowWater: 1 << 20, MaxDirtyAge: time.Second}, 4096, 0, true, func(r resolved) bool {
			return r.lowPages == r.limitPages-1
		}},
		{"tiny cache", Config{Size: 16 << 10}, 512, 0, false, nil},
		{"odd block size", Config{}, 520, 0, false, nil},
		{"page holds too many blocks", Config{PageSize: 64 << 10}, 512, 0, false, nil},
		{"dirty limit above size", Config{Size: 1 << 20, DirtyLimit: 2 << 20}, 512, 0, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := resolve(tc.cfg, tc.bs, tc.maxXfer)
			if (err == nil) != tc.ok {
				t.Fatalf("resolve: %v, want ok=%v", err, tc.ok)
			}
			if tc.ok && !tc.check(r) {
				t.Fatalf("resolved %+v", r)
			}
		})
	}
}

// TestParseConfigHugeDirtySize: a --cache-dirty size beyond int64 ("10e", 10 EB) is refused as
// larger than the cache instead of wrapping negative (found by FuzzParseConfig).
func TestParseConfigHugeDirtySize(t *testing.T) {
	for _, dirty := range []string{"10e", "16EiB", "18446744073709551615"} {
		if cfg, err := ParseConfig("", "1", dirty); err == nil {
			t.Errorf("ParseConfig(\"\", \"1\", %q) = %+v, want an error", dirty, cfg)
		}
	}
}

func TestSizeFor(t *testing.T) {
	for _, tc := range []struct{ mem, want int64 }{
		{0, DefaultSize},         // unknown
		{512 << 20, MinAutoSize}, // a tiny VM: the floor
		{2 << 30, 128 << 20},     // a sixteenth
		{16 << 30, 1 << 30},      // reaches the cap
		{256 << 30, DefaultSize}, // capped
		{2067795968, 123 << 20},  // a 2 GiB guest's MemTotal (1.93 GiB): a whole MiB
	} {
		if got := SizeFor(tc.mem); got != tc.want {
			t.Errorf("SizeFor(%d) = %d, want %d", tc.mem, got, tc.want)
		}
	}
}
