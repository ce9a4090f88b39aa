// Package holders finds who uses a block device before a gateway removes it: mounts
// (/proc/self/mountinfo, proc(5)), stacked devices (/sys/block/X/holders: device-mapper, md,
// …) and processes holding it open (/proc/PID/fd), for the device and each of its partitions.
// `detach` refuses a device with holders unless forced, naming them (issue 16).
//
// It reads only procfs and sysfs and knows nothing of NBD or ublk. A process's fds that cannot
// be read (it exited, or permission) are skipped: the answer is best effort for processes, exact
// for mounts and stacked devices.
package holders

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Holder is one user of the device.
type Holder struct {
	Kind string // "mount", "holder" (a stacked block device) or "open" (a process)
	What string // the mount point, the holder device's name, or "PID N (comm)"
	Dev  string // the device or partition held, e.g. nbd0p1
}

func (h Holder) String() string {
	switch h.Kind {
	case "mount":
		return fmt.Sprintf("%s is mounted at %s", h.Dev, h.What)
	case "holder":
		return fmt.Sprintf("%s is held by %s", h.Dev, h.What)
	}
	return fmt.Sprintf("%s is open in %s", h.Dev, h.What)
}

// Finder looks in ProcRoot and SysRoot (tests point them at a fake tree) and ignores SkipPID's
// own open fds (the gateway's).
type Finder struct {
	ProcRoot, SysRoot string
	SkipPID           int
}

// Find returns the holders of the block device at path (e.g. /dev/nbd0) with the system's
// /proc and /sys, not counting this process.
func Find(path string) ([]Holder, error) {
	return Finder{ProcRoot: "/proc", SysRoot: "/sys", SkipPID: os.Getpid()}.Find(path)
}

// Find returns path's holders. path must be a block device.
func (f Finder) Find(path string) ([]Holder, error) {
	devs, err := f.devices(path)
	if err != nil {
		return nil, err
	}
	var out []Holder
	mounts, err := f.mounts(devs)
	if err != nil {
		return nil, err
	}
	out = append(out, mounts...)
	out = append(out, f.stacked(devs)...)
	out = append(out, f.openers(devs)...)
	return out, nil
}

// devices maps "major:minor" to the name of the device and each of its partitions.
func (f Finder) devices(path string) (map[string]string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, fmt.Errorf("holders: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return nil, fmt.Errorf("holders: %s is not a block device", path)
	}
	num := fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	name, err := f.sysName(num)
	if err != nil {
		return nil, err
	}
	devs := map[string]string{num: name}
	ents, _ := os.ReadDir(filepath.Join(f.SysRoot, "block", name))
	for _, e := range ents {
		dir := filepath.Join(f.SysRoot, "block", name, e.Name())
		if _, err := os.Stat(filepath.Join(dir, "partition")); err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(dir, "dev")); err == nil {
			devs[strings.TrimSpace(string(b))] = e.Name()
		}
	}
	return devs, nil
}

// sysName finds the kernel's name of device num through /sys/dev/block/MAJ:MIN.
func (f Finder) sysName(num string) (string, error) {
	target, err := os.Readlink(filepath.Join(f.SysRoot, "dev", "block", num))
	if err != nil {
		return "", fmt.Errorf("holders: device %s unknown to sysfs: %w", num, err)
	}
	return filepath.Base(target), nil
}

// mounts reads mountinfo: field 3 is major:minor, field 5 the mount point (octal-escaped).
func (f Finder) mounts(devs map[string]string) ([]Holder, error) {
	file, err := os.Open(filepath.Join(f.ProcRoot, "self", "mountinfo"))
	if err != nil {
		return nil, fmt.Errorf("holders: %w", err)
	}
	defer file.Close()
	var out []Holder
	sc := bufio.NewScanner(file)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		if name, ok := devs[fields[2]]; ok {
			out = append(out, Holder{Kind: "mount", What: unescapeMount(fields[4]), Dev: name})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("holders: mountinfo: %w", err)
	}
	return out, nil
}

// unescapeMount decodes mountinfo's \NNN octal escapes (space, tab, newline, backslash).
func unescapeMount(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// stacked lists /sys/block/X/holders (and each partition's).
func (f Finder) stacked(devs map[string]string) []Holder {
	var out []Holder
	whole := f.wholeName(devs)
	for _, name := range devs {
		dir := filepath.Join(f.SysRoot, "block", whole, name, "holders")
		if name == whole {
			dir = filepath.Join(f.SysRoot, "block", whole, "holders")
		}
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			out = append(out, Holder{Kind: "holder", What: e.Name(), Dev: name})
		}
	}
	return out
}

// wholeName is the whole device's name: the one partitions are named under.
func (f Finder) wholeName(devs map[string]string) string {
	for _, name := range devs {
		if _, err := os.Stat(filepath.Join(f.SysRoot, "block", name)); err == nil {
			return name
		}
	}
	return ""
}

// openers scans every process's fds for the devices.
func (f Finder) openers(devs map[string]string) []Holder {
	procs, _ := os.ReadDir(f.ProcRoot)
	var out []Holder
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == f.SkipPID {
			continue
		}
		fdDir := filepath.Join(f.ProcRoot, p.Name(), "fd")
		fds, _ := os.ReadDir(fdDir)
		seen := map[string]bool{}
		for _, fd := range fds {
			name, ok := f.openDevice(filepath.Join(fdDir, fd.Name()), devs)
			if ok && !seen[name] {
				seen[name] = true
				out = append(out, Holder{Kind: "open", What: fmt.Sprintf("PID %d (%s)", pid, f.comm(p.Name())), Dev: name})
			}
		}
	}
	return out
}

func (f Finder) openDevice(fdPath string, devs map[string]string) (string, bool) {
	var st unix.Stat_t
	if err := unix.Stat(fdPath, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return "", false
	}
	name, ok := devs[fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))]
	return name, ok
}

func (f Finder) comm(pid string) string {
	b, err := os.ReadFile(filepath.Join(f.ProcRoot, pid, "comm"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "exited"
		}
		return "?"
	}
	return strings.TrimSpace(string(b))
}
