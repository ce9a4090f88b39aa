// Package memlimit answers how much memory this process may use: the smaller of the host's
// MemTotal and every memory limit of the cgroups it belongs to.
//
// A gateway sizes its cache from this (cache.SizeFor) and the CSI plugin divides its memory
// budget by it. Reading only /proc/meminfo, as before, sized a gateway in a container or a
// systemd slice with MemoryMax= for the whole host, and the kernel's OOM killer settled the
// difference.
//
// Invariants:
//   - The answer never exceeds MemTotal, and it is 0 only when MemTotal cannot be read (callers
//     then use their fixed defaults).
//   - A limit applies to the whole subtree below its cgroup, so every ancestor's limit counts,
//     up to the cgroup mount's root: with a cgroup namespace (a container) that root is the
//     container's own cgroup, whose limit is the pod's.
//   - "max" (cgroup v2) and cgroup v1's "no limit" (a page-rounded 2^63-1) are no limit.
//
// Sources: Documentation/admin-guide/cgroup-v2.rst (memory.max), cgroup-v1/memory.rst
// (memory.limit_in_bytes), proc(5) for /proc/self/cgroup's hierarchy-ID:controllers:path lines.
package memlimit
