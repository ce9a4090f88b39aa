#!/usr/bin/python3
"""test/vm/guest/powercut-fs.py — the file workload of the power-cut test (test/vm/powercut.sh).

    powercut-fs.py write DIR PROGRESS [MAX_OPS]   write until killed (or MAX_OPS done)
    powercut-fs.py verify DIR PROGRESS            check every durable record; exit 1 on a loss

write: each operation first appends "begin NAME GEN SIZE" to PROGRESS, then either creates a new
file (GEN 0) or, every third operation, replaces an existing one with its next generation
(written to a temporary file, fsynced, renamed over it), fsyncs the file and the directory, and
only then appends "done NAME GEN SIZE". The content is a function of (NAME, GEN) alone. PROGRESS
lives on a host directory shared over 9p, where each write reaches the host at once, so a "done"
line the host reads names a file the guest's file system reported durable before the power cut.

verify: every file whose last record is "done" must hold exactly that generation; one whose last
record is a "begin" (the operation the power cut interrupted) may hold the last done generation
or the begun one (a rename is atomic), or, for a new file, be absent or hold anything. Only
complete lines count (the cut may leave half a line). Prints "records=N files=M verified=M" and
a line per mismatch.
"""
import hashlib
import os
import sys


def content(name, gen, size):
    return hashlib.shake_256(f"{name}:{gen}".encode()).digest(size)


def size_of(i):
    # 4 KiB to 64 KiB, most not a multiple of the block size
    return 4096 * (1 + i % 16) + (i * 37) % 4096


def append(fd, line):
    os.write(fd, (line + "\n").encode())


def write(d, progress, max_ops):
    os.makedirs(d, exist_ok=True)
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    pfd = os.open(progress, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    gens = []  # gens[k] is the generation of file k
    for i in range(max_ops):
        if i % 3 == 2 and gens:
            k = (i * 7919) % len(gens)
            gens[k] += 1
            name, gen = f"f{k:06d}", gens[k]
        else:
            gens.append(0)
            name, gen = f"f{len(gens) - 1:06d}", 0
        size = size_of(i)
        append(pfd, f"begin {name} {gen} {size}")
        path = os.path.join(d, name)
        tmp = path + ".tmp" if gen else path
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, content(name, gen, size))
        os.fsync(fd)
        os.close(fd)
        if gen:
            os.rename(tmp, path)
        os.fsync(dfd)
        append(pfd, f"done {name} {gen} {size}")
    return 0


def verify(d, progress):
    with open(progress, "rb") as f:
        raw = f.read()
    lines = raw.decode().split("\n")[:-1]  # the last element is "" or a torn line
    done, begun = {}, {}
    records = 0
    for ln in lines:
        kind, name, gen, size = ln.split()
        if kind == "begin":
            begun[name] = (int(gen), int(size))
        elif kind == "done":
            done[name] = (int(gen), int(size))
            begun.pop(name, None)
            records += 1
        else:
            raise SystemExit(f"bad progress line {ln!r}")
    bad = 0
    verified = 0
    for name, (gen, size) in sorted(done.items()):
        ok = [content(name, gen, size)]
        if name in begun:
            ok.append(content(name, *begun[name]))
        try:
            with open(os.path.join(d, name), "rb") as f:
                got = f.read()
        except OSError as e:
            print(f"LOST {name}: generation {gen} was durable, now: {e}")
            bad += 1
            continue
        if got not in ok:
            print(f"LOST {name}: generation {gen} ({size} bytes) was durable; the file has "
                  f"{len(got)} bytes of other content")
            bad += 1
            continue
        verified += 1
    print(f"records={records} files={len(done)} verified={verified} in-flight={len(begun)}")
    return 1 if bad or not done else 0


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "write":
        return write(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 1 << 30)
    if len(sys.argv) == 4 and sys.argv[1] == "verify":
        return verify(sys.argv[2], sys.argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
