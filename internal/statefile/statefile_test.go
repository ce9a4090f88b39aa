package statefile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/iser-blk/iser-blk/internal/modes"
)

var lun = Identity{Target: "iqn.2026-01.test:t1", LUN: 1, DeviceID: "naa.600140512345", Size: 1 << 30, BlockSize: 512}

func TestWriteReadRoundTrip(t *testing.T) {
	dir := t.TempDir()
	p := Path(dir, "gw1")
	want := Fresh("gw1", modes.Ublk, 3, lun, modes.WriteBack, 42)
	want.Dirty = true
	if err := Write(p, want); err != nil {
		t.Fatal(err)
	}
	got, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "gw1" || got.Kind != modes.Ublk || got.CacheMode != modes.WriteBack || got.DevID != 3 || got.LUN != lun || !got.Dirty || got.PID != 42 || got.Version != Version {
		t.Fatalf("read back %+v", got)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v", fi.Mode(), err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("temporary files left behind: %v", ents)
	}
}

func TestWriteReplacesAtomically(t *testing.T) {
	dir := t.TempDir()
	p := Path(dir, "gw")
	s := Fresh("gw", modes.NBD, 0, lun, modes.WriteBack, 1)
	if err := Write(p, s); err != nil {
		t.Fatal(err)
	}
	s.Dirty = false
	if err := Write(p, s); err != nil {
		t.Fatal(err)
	}
	got, err := Read(p)
	if err != nil || got.Dirty {
		t.Fatalf("got %+v, %v", got, err)
	}
}

func TestWriteFailsInMissingDir(t *testing.T) {
	if err := Write(filepath.Join(t.TempDir(), "no", "x.json"), Fresh("x", modes.Ublk, 0, lun, modes.Off, 1)); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
}

func TestReadErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Read(Path(dir, "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	cases := map[string]struct {
		body string
		want error
	}{
		"garbage":   {"{not json", ErrCorrupt},
		"truncated": {`{"version":1,"name":"a"`, ErrCorrupt},
		"unknown":   {`{"version":1,"bogus":1}`, ErrCorrupt},
		"version":   {`{"version":9,"kind":"ublk"}`, ErrVersion},
		"kind":      {`{"version":1,"kind":"loop","cache_mode":"off","lun":{"size":1,"block_size":512}}`, ErrCorrupt},
		"cache":     {`{"version":1,"kind":"ublk","cache_mode":"maybe","lun":{"size":1,"block_size":512}}`, ErrCorrupt},
		"no cache":  {`{"version":1,"kind":"ublk","lun":{"size":1,"block_size":512}}`, ErrCorrupt},
		"size":      {`{"version":1,"kind":"ublk","cache_mode":"off","lun":{"size":0,"block_size":512}}`, ErrCorrupt},
		"devid":     {`{"version":1,"kind":"nbd","dev_id":-1,"cache_mode":"off","lun":{"size":1,"block_size":512}}`, ErrCorrupt},
		"huge":      {strings.Repeat(" ", maxFileBytes+1), ErrCorrupt},
	}
	for name, c := range cases {
		p := Path(dir, name)
		if err := os.WriteFile(p, []byte(c.body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Read(p); !errors.Is(err, c.want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: got %v, want %v naming the file", name, err, c.want)
		}
	}
}

func TestCheckIdentity(t *testing.T) {
	s := Fresh("gw", modes.Ublk, 0, lun, modes.Off, 1)
	if err := s.CheckIdentity(lun); err != nil {
		t.Fatalf("same LUN: %v", err)
	}
	noID := lun
	noID.DeviceID = ""
	if err := s.CheckIdentity(noID); err != nil {
		t.Fatalf("missing designator must not count as foreign: %v", err)
	}
	for _, mod := range []func(*Identity){
		func(i *Identity) { i.Target = "iqn.other" },
		func(i *Identity) { i.LUN = 2 },
		func(i *Identity) { i.DeviceID = "naa.6001405ffff" },
		func(i *Identity) { i.Size *= 2 },
		func(i *Identity) { i.BlockSize = 4096 },
	} {
		other := lun
		mod(&other)
		if err := s.CheckIdentity(other); !errors.Is(err, ErrForeign) {
			t.Errorf("%+v: got %v, want ErrForeign", other, err)
		}
	}
}

func TestResumable(t *testing.T) {
	for _, c := range []struct {
		mode  modes.Cache
		dirty bool
		ok    bool
	}{
		{modes.Off, false, true}, {modes.WriteThrough, false, true},
		{modes.WriteBack, false, true}, {modes.WriteBack, true, false},
		// a fence passed on by a successor with another cache mode stays a fence
		{modes.Off, true, false}, {modes.WriteThrough, true, false},
	} {
		s := State{CacheMode: c.mode, Dirty: c.dirty, PID: 7}
		ok, why := s.Resumable()
		if ok != c.ok || (ok == (why != "")) {
			t.Errorf("%s dirty=%v: ok=%v why=%q", c.mode, c.dirty, ok, why)
		}
	}
	if Fresh("a", modes.Ublk, 0, lun, modes.WriteBack, 1).Dirty || Fresh("a", modes.Ublk, 0, lun, modes.WriteThrough, 1).Dirty {
		t.Fatal("Fresh must be clean: nothing is acknowledged before the device serves (the gate marks dirty)")
	}
}
