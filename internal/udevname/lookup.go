package udevname

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ErrKernelName: the argument is not the kernel name of a whole nbd or ublk disk.
var ErrKernelName = errors.New("not an nbd or ublk disk name (nbdN, ublkbN)")

// DefaultBackendWait is how long Lookup waits for an nbd device that has a size but no backend
// file yet: the kernel sends the uevent of NBD_CMD_CONNECT when it sets the size, and creates
// /sys/block/nbdN/backend just after, so udev can run in between.
const DefaultBackendWait = 2 * time.Second

// pollInterval is how often that wait looks again.
const pollInterval = 10 * time.Millisecond

// Options say where Lookup looks; the zero value is the host's.
type Options struct {
	SysBlock    string        // default /sys/block
	RunDir      string        // the run directory (control.RunDir); required for ublk
	BackendWait time.Duration // default DefaultBackendWait; negative: do not wait
	Warn        func(error)   // told about run-directory files that were skipped (nil: not told)
}

// Lookup names the gateway serving the kernel block device kernelName ("nbd0", "ublkb3").
// ok is false when no gateway started with --name serves it: an unconfigured nbd device,
// another program's, an unnamed gateway's. err is for what cannot be answered: a bad name, a
// device that does not exist, an unreadable run directory.
func Lookup(kernelName string, o Options) (d Device, ok bool, err error) {
	if o.SysBlock == "" {
		o.SysBlock = "/sys/block"
	}
	if o.BackendWait == 0 {
		o.BackendWait = DefaultBackendWait
	}
	if o.Warn == nil {
		o.Warn = func(error) {}
	}
	kind, id, err := parseKernelName(kernelName)
	if err != nil {
		return Device{}, false, err
	}
	dir := filepath.Join(o.SysBlock, kernelName)
	if _, err := os.Stat(dir); err != nil {
		return Device{}, false, fmt.Errorf("%s: %w", kernelName, err)
	}
	if kind == "nbd" {
		return lookupNBD(dir, time.Now().Add(o.BackendWait))
	}
	if o.RunDir == "" {
		return Device{}, false, errors.New("udevname: no run directory")
	}
	return lookupUblk(o.RunDir, id, o.Warn)
}

// parseKernelName splits "nbd12" into ("nbd", 12) and "ublkb3" into ("ublk", 3); partitions
// and anything else are ErrKernelName (the rule gives partitions their disk's name).
func parseKernelName(s string) (kind string, id int, err error) {
	for _, k := range []struct{ prefix, kind string }{{"ublkb", "ublk"}, {"nbd", "nbd"}} {
		digits, found := strings.CutPrefix(s, k.prefix)
		if !found || digits == "" || len(digits) > 7 || strings.Trim(digits, "0123456789") != "" ||
			(len(digits) > 1 && digits[0] == '0') {
			continue
		}
		n, err := strconv.Atoi(digits)
		if err != nil {
			break
		}
		return k.kind, n, nil
	}
	return "", 0, fmt.Errorf("%q: %w", s, ErrKernelName)
}

// lookupNBD reads the device's backend identifier. A device of size 0 is not configured; one
// with a size and no backend file gets until deadline for the kernel to create it (after which
// it is taken for one configured without an identifier: through ioctls, or by another program).
func lookupNBD(dir string, deadline time.Time) (Device, bool, error) {
	for {
		b, err := os.ReadFile(filepath.Join(dir, "backend"))
		if err == nil {
			name, target, ok := ParseBackendID(string(b))
			return Device{Name: name, Target: target}, ok, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return Device{}, false, err
		}
		size, err := os.ReadFile(filepath.Join(dir, "size"))
		if err != nil {
			return Device{}, false, err
		}
		if strings.TrimSpace(string(size)) == "0" || !time.Now().Before(deadline) {
			return Device{}, false, nil
		}
		time.Sleep(pollInterval)
	}
}
