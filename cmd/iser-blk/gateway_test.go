package main

import (
	"fmt"
	"os"
	"testing"
)

// TestDefaultNames: serve is named after its socket (without extension) or nbd-tcp-PORT; attach
// after --nbd's device, and only later (from the kernel's device) for --ublk and --nbd auto.
func TestDefaultNames(t *testing.T) {
	for _, c := range []struct{ spec, name, where string }{
		{"unix:///run/db.sock", "db", "/run/db.sock"},
		{"unix:///tmp/x/nbd", "nbd", "/tmp/x/nbd"},
		{"tcp://0.0.0.0:10809", "nbd-tcp-10809", "0.0.0.0:10809"},
		{"tcp://127.0.0.1:0", fmt.Sprintf("nbd-tcp-pid%d", os.Getpid()), "127.0.0.1:0"},
	} {
		name, where, err := serveIdentity(c.spec)
		if err != nil || name != c.name || where != c.where {
			t.Errorf("serveIdentity(%q) = %q, %q, %v; want %q, %q", c.spec, name, where, err, c.name, c.where)
		}
	}
	for _, c := range []struct {
		af   attachFlags
		flag string
		want string
	}{
		{attachFlags{nbdDev: "/dev/nbd3"}, "", "nbd3"},
		{attachFlags{nbdDev: "/dev/nbd3"}, "db", "db"},
		{attachFlags{nbdDev: "auto"}, "", ""},
		{attachFlags{useUblk: true}, "", ""},
		{attachFlags{useUblk: true}, "disk1", "disk1"},
	} {
		if got := c.af.earlyName(&serviceFlags{name: c.flag}); got != c.want {
			t.Errorf("earlyName(%+v, --name %q) = %q, want %q", c.af, c.flag, got, c.want)
		}
	}
}
