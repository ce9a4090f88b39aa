package memlimit

import (
	"os"
	"testing"
	"testing/fstest"
)

func file(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }

const meminfo = "MemTotal:       16384000 kB\nMemFree:         1000 kB\n" // 15.6 GiB

func TestOf(t *testing.T) {
	const total = 16384000 << 10
	cases := []struct {
		name string
		fs   fstest.MapFS
		want int64
	}{
		{"no meminfo", fstest.MapFS{}, 0},
		{"meminfo only", fstest.MapFS{"proc/meminfo": file(meminfo)}, total},
		{"v2 limit on the cgroup", fstest.MapFS{
			"proc/meminfo":     file(meminfo),
			"proc/self/cgroup": file("0::/system.slice/iser-blk@a.service\n"),
			"sys/fs/cgroup/system.slice/iser-blk@a.service/memory.max": file("1073741824\n"),
			"sys/fs/cgroup/system.slice/memory.max":                    file("max\n"),
		}, 1 << 30},
		{"v2 limit on an ancestor (a slice)", fstest.MapFS{
			"proc/meminfo":     file(meminfo),
			"proc/self/cgroup": file("0::/iser-blk.slice/iser-blk@a.service\n"),
			"sys/fs/cgroup/iser-blk.slice/iser-blk@a.service/memory.max": file("max\n"),
			"sys/fs/cgroup/iser-blk.slice/memory.max":                    file("536870912\n"),
		}, 512 << 20},
		{"v2 in a cgroup namespace: the mount root is the pod's cgroup", fstest.MapFS{
			"proc/meminfo":             file(meminfo),
			"proc/self/cgroup":         file("0::/\n"),
			"sys/fs/cgroup/memory.max": file("2147483648\n"),
		}, 2 << 30},
		{"v1 memory controller", fstest.MapFS{
			"proc/meminfo":     file(meminfo),
			"proc/self/cgroup": file("4:memory:/kubepods/pod1\n3:cpu,cpuacct:/kubepods/pod1\n0::/\n"),
			"sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes": file("9223372036854771712\n"),
			"sys/fs/cgroup/memory/kubepods/memory.limit_in_bytes":      file("3221225472\n"),
			"sys/fs/cgroup/memory/memory.limit_in_bytes":               file("9223372036854771712\n"),
		}, 3 << 30},
		{"a limit above MemTotal is MemTotal", fstest.MapFS{
			"proc/meminfo":               file(meminfo),
			"proc/self/cgroup":           file("0::/a\n"),
			"sys/fs/cgroup/a/memory.max": file("68719476736\n"),
		}, total},
		{"garbage is no limit", fstest.MapFS{
			"proc/meminfo":               file(meminfo),
			"proc/self/cgroup":           file("garbage\n0::relative\n0::/a\n"),
			"sys/fs/cgroup/a/memory.max": file("lots\n"),
		}, total},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Of(c.fs); got != c.want {
				t.Fatalf("Of = %d, want %d", got, c.want)
			}
		})
	}
}

// TestOwn: on the machine running the tests, the answer is positive and at most MemTotal.
func TestOwn(t *testing.T) {
	got := Own()
	if got <= 0 {
		t.Fatal("no memory limit read from /proc")
	}
	if total := memTotal(os.DirFS("/")); got > total {
		t.Fatalf("Own %d above MemTotal %d", got, total)
	}
}
