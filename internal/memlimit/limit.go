package memlimit

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
)

// Own is Of the running system's root file system.
func Own() int64 { return Of(os.DirFS("/")) }

// Of is the memory, in bytes, a process whose /proc/self and /sys/fs/cgroup are in root may use:
// the smallest of MemTotal and the memory limits of its cgroups and their ancestors; 0 when
// MemTotal cannot be read. Paths in root have no leading slash (fs.FS).
func Of(root fs.FS) int64 {
	total := memTotal(root)
	if total <= 0 {
		return 0
	}
	lim := total
	for _, f := range limitFiles(root) {
		if v, ok := readLimit(root, f); ok && v < lim {
			lim = v
		}
	}
	return lim
}

// memTotal is /proc/meminfo's MemTotal in bytes, or 0.
func memTotal(root fs.FS) int64 {
	b, err := fs.ReadFile(root, "proc/meminfo")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || kb <= 0 || kb > 1<<53 {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// limitFiles lists the limit files that bind this process: for its cgroup v2 path and its
// cgroup v1 memory path, the file in that cgroup and in each ancestor up to the mount's root.
// A cgroup that the mount does not show (another namespace's view) contributes what is there.
func limitFiles(root fs.FS) []string {
	b, err := fs.ReadFile(root, "proc/self/cgroup")
	if err != nil {
		return nil
	}
	var files []string
	for _, line := range strings.Split(string(b), "\n") {
		id, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		controllers, p, ok := strings.Cut(rest, ":")
		if !ok || !strings.HasPrefix(p, "/") {
			continue
		}
		switch {
		case id == "0" && controllers == "":
			// cgroup v2: mounted at /sys/fs/cgroup (unified), or at /sys/fs/cgroup/unified beside v1
			for _, mnt := range []string{"sys/fs/cgroup", "sys/fs/cgroup/unified"} {
				files = append(files, chain(mnt, p, "memory.max")...)
			}
		case hasController(controllers, "memory"):
			files = append(files, chain("sys/fs/cgroup/memory", p, "memory.limit_in_bytes")...)
		}
	}
	return files
}

// chain is file in the cgroup directory p under mnt and in each of its ancestors.
func chain(mnt, p, file string) []string {
	var out []string
	for p = path.Clean(p); ; p = path.Dir(p) {
		out = append(out, path.Join(mnt, p, file))
		if p == "/" {
			return out
		}
	}
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// noLimitV1 is the smallest value cgroup v1 shows for "no limit": 2^63-1 rounded down to a
// page; anything at least this large is no limit on any page size.
const noLimitV1 = (1<<63 - 1) &^ (1<<16 - 1)

// readLimit reads a memory.max or memory.limit_in_bytes file; ok is false for no limit, a
// missing file or an unreadable value.
func readLimit(root fs.FS, file string) (int64, bool) {
	b, err := fs.ReadFile(root, file)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v <= 0 || v >= noLimitV1 {
		return 0, false
	}
	return v, true
}
