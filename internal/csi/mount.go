package csi

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Mounter is what the node does to filesystems and mount points; SystemMounter is the real one.
type Mounter interface {
	// Mounted reports whether path is a mount point.
	Mounted(path string) (bool, error)
	// Probe says what is on device: its filesystem type ("" for none) and whether it holds a
	// partition table.
	Probe(ctx context.Context, device string) (fsType string, partitioned bool, err error)
	// Format makes a filesystem of fsType on device.
	Format(ctx context.Context, device, fsType string) error
	// Mount mounts device's filesystem (fsType) at target with the mount options.
	Mount(ctx context.Context, device, target, fsType string, options []string) error
	// Bind bind-mounts source (a directory, or a device onto a file) at target, read-only when
	// readOnly, with the extra mount options.
	Bind(ctx context.Context, source, target string, readOnly bool, options []string) error
	// Unmount unmounts target.
	Unmount(target string) error
}

// SupportedFSTypes are the filesystems NodeStage makes and mounts; the first is the default.
var SupportedFSTypes = []string{"ext4", "xfs"}

// SystemMounter runs util-linux's mount(8), blkid(8) and mkfs(8) (their option parsing and
// helpers are the kernel's reference), and reads /proc/self/mountinfo.
type SystemMounter struct{}

// Mounted implements Mounter.
func (SystemMounter) Mounted(path string) (bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	return mountedIn(f, path)
}

// mountedIn reports whether path is a mount point in a mountinfo table.
func mountedIn(r io.Reader, path string) (bool, error) {
	want := filepath.Clean(path)
	if real, err := filepath.EvalSymlinks(want); err == nil {
		want = real
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// mountinfo(5): ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS ...; spaces escaped as \040
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMountinfo(fields[4]) == want {
			return true, nil
		}
	}
	return false, sc.Err()
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 space, \011 tab, \012, \134).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Probe implements Mounter: blkid -p (low-level probing, no cache) prints TYPE= for a
// filesystem and PTTYPE= for a partition table; exit 2 means it found nothing.
func (SystemMounter) Probe(ctx context.Context, device string) (string, bool, error) {
	out, err := run(ctx, "blkid", "-p", "-o", "export", device)
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 2 {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	var fsType string
	var partitioned bool
	for _, line := range strings.Split(string(out), "\n") {
		k, v, _ := strings.Cut(line, "=")
		switch k {
		case "TYPE":
			fsType = v
		case "PTTYPE":
			partitioned = true
		}
	}
	return fsType, partitioned, nil
}

// Format implements Mounter. Neither mkfs discards the device: a LUN's UNMAP of every block
// over the network can take minutes, and the device was found empty by Probe.
func (SystemMounter) Format(ctx context.Context, device, fsType string) error {
	var err error
	switch fsType {
	case "ext4":
		_, err = run(ctx, "mkfs.ext4", "-F", "-E", "nodiscard", device) // -F: a whole disk, no question
	case "xfs":
		_, err = run(ctx, "mkfs.xfs", "-K", device)
	default:
		return fmt.Errorf("cannot make a %q filesystem", fsType)
	}
	return err
}

// Mount implements Mounter.
func (SystemMounter) Mount(ctx context.Context, device, target, fsType string, options []string) error {
	args := []string{"-t", fsType}
	if len(options) > 0 {
		args = append(args, "-o", strings.Join(options, ","))
	}
	_, err := run(ctx, "mount", append(args, "--", device, target)...)
	return err
}

// Bind implements Mounter: a bind mount ignores MS_RDONLY and the other flags on creation, so
// read-only (and the options) take a remount of the bind.
func (SystemMounter) Bind(ctx context.Context, source, target string, readOnly bool, options []string) error {
	if _, err := run(ctx, "mount", "--bind", "--", source, target); err != nil {
		return err
	}
	if !readOnly && len(options) == 0 {
		return nil
	}
	opts := append([]string{"remount", "bind"}, options...)
	if readOnly {
		opts = append(opts, "ro")
	}
	if _, err := run(ctx, "mount", "-o", strings.Join(opts, ","), "--", target); err != nil {
		_ = unix.Unmount(target, 0) // not left writable by half
		return err
	}
	return nil
}

// Unmount implements Mounter.
func (SystemMounter) Unmount(target string) error {
	if err := unix.Unmount(target, 0); err != nil {
		return fmt.Errorf("unmount %s: %w", target, err)
	}
	return nil
}

// run runs a command and returns its stdout; its error carries the command and its stderr.
func run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}
