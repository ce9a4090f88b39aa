// Package netns builds network namespaces joined to the test's own namespace by veth pairs, so
// that end-to-end tests can cut a path silently (packets vanish: no RST, no ICMP) the way a
// pulled cable or a dead switch does. It needs root and iproute2. Addresses are from
// 10.213.0.0/16 and exist only on the veth pairs it creates; nothing leaves the machine.
package netns

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// NS is a network namespace removed at test cleanup.
type NS struct {
	Name string
}

// Link is a veth pair: HostIf in the test's namespace, NSIf inside NS.
type Link struct {
	HostIf, NSIf string
	HostIP, NSIP string // addresses without prefix length
	ns           string
}

var subnet atomic.Uint32

func init() {
	var b [1]byte
	_, _ = rand.Read(b[:])
	subnet.Store(uint32(b[0]) % 200 * 64) // spread /30s over 10.213.0.0/16 between test binaries
}

func suffix() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Run runs a command (with a timeout) and returns its combined output.
func Run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// New creates a namespace with its loopback up.
func New(t testing.TB) *NS {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatalf("netns: iproute2's ip not found: %v", err)
	}
	n := &NS{Name: "iserblk-" + suffix()}
	if _, err := Run("ip", "netns", "add", n.Name); err != nil {
		t.Fatalf("netns: %v", err)
	}
	t.Cleanup(func() { _, _ = Run("ip", "netns", "del", n.Name) })
	if _, err := Run("ip", "netns", "exec", n.Name, "ip", "link", "set", "lo", "up"); err != nil {
		t.Fatalf("netns: %v", err)
	}
	return n
}

// AddLink joins n to the test's namespace with a new veth pair on a fresh /30.
func (n *NS) AddLink(t testing.TB) *Link {
	t.Helper()
	k := subnet.Add(1) % (1 << 14) // /30 index in 10.213.0.0/16
	base := k * 4
	ip := func(host uint32) string { return fmt.Sprintf("10.213.%d.%d", (base+host)>>8&0xff, (base+host)&0xff) }
	s := suffix()
	l := &Link{HostIf: "ibh" + s, NSIf: "ibn" + s, HostIP: ip(1), NSIP: ip(2), ns: n.Name}
	steps := [][]string{
		{"ip", "link", "add", l.HostIf, "type", "veth", "peer", "name", l.NSIf},
		{"ip", "link", "set", l.NSIf, "netns", n.Name},
		{"ip", "addr", "add", l.HostIP + "/30", "dev", l.HostIf},
		{"ip", "link", "set", l.HostIf, "up"},
		{"ip", "netns", "exec", n.Name, "ip", "addr", "add", l.NSIP + "/30", "dev", l.NSIf},
		{"ip", "netns", "exec", n.Name, "ip", "link", "set", l.NSIf, "up"},
	}
	for i, st := range steps {
		if _, err := Run(st...); err != nil {
			if i > 0 {
				_, _ = Run("ip", "link", "del", l.HostIf)
			}
			t.Fatalf("netns: %v", err)
		}
	}
	t.Cleanup(func() { _, _ = Run("ip", "link", "del", l.HostIf) })
	return l
}

// Cut takes the namespace's end of the link down: the host end loses carrier and drops what it
// sends, the namespace's answers have nowhere to go. Neither side gets an RST or an ICMP error:
// TCP just retransmits, as across a dead cable.
func (l *Link) Cut() error {
	_, err := Run("ip", "netns", "exec", l.ns, "ip", "link", "set", l.NSIf, "down")
	return err
}

// Restore brings the namespace's end back up.
func (l *Link) Restore() error {
	_, err := Run("ip", "netns", "exec", l.ns, "ip", "link", "set", l.NSIf, "up")
	return err
}
