"""Unit test of vm_iser.py's table from fio JSON files as the guest writes them. Run by make
test's py tier (test/pyunit.py)."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vm_iser  # noqa: E402


def fio_json(iops, mib, p50_us, write=False):
    side = dict(iops=iops, bw_bytes=mib * 2**20, total_ios=iops * 10,
                clat_ns={"percentile": {"50.000000": p50_us * 1000}})
    empty = dict(iops=0, bw_bytes=0, clat_ns={})
    return {"jobs": [{"write": side if write else empty, "read": empty if write else side}]}


class TableTest(unittest.TestCase):
    def test_ratios_to_the_kernel_of_the_same_transport(self):
        with tempfile.TemporaryDirectory() as out:
            g = os.path.join(out, "guest")
            os.makedirs(g)
            rows = [(1, "iser-blk-ublk-tcp", 900, 90, 40, 20.0), (2, "iser-blk-ublk-tcp", 1100, 110, 60, 30.0),
                    (1, "kernel-tcp", 1000, 100, 50, 25.0), (2, "kernel-tcp", 1000, 100, 50, 25.0),
                    (1, "iser-blk-iser", 500, 50, 10, None), (1, "kernel-iser", 1000, 100, 20, 5.0),
                    (1, "iser-blk-ublk-tcp-workers", 800, 80, 70, 40.0)]
            for rep, s, iops, mib, p50, cpu in rows:
                f = os.path.join(g, f"{rep}-randread-4k-qd1-{s}.json")
                json.dump(fio_json(iops, mib, p50), open(f, "w"))
                if cpu is not None:
                    open(f + ".cpu", "w").write(f"{cpu}\n")
                if s == "iser-blk-ublk-tcp":
                    open(f + ".calls", "w").write(f"{iops * 10 * rep * 3}\n")  # 3 and 6 per I/O
            json.dump(fio_json(1, 1, 1), open(os.path.join(g, "1-randread-4k-qd1-other.json"), "w"))
            lines = vm_iser.table(vm_iser.load(out))
        by = {l.split(" | ")[1]: l for l in lines if l.startswith("| randread-4k-qd1 |")}
        self.assertEqual(sorted(by), ["iser-blk-iser", "iser-blk-ublk-tcp", "iser-blk-ublk-tcp-workers", "kernel-iser",
                                      "kernel-tcp"])
        # the workers-only A/B system is its own row, compared with kernel-tcp too
        self.assertTrue(by["iser-blk-ublk-tcp-workers"].endswith("| 0.80× | 1.40× | 1.60× |"),
                        by["iser-blk-ublk-tcp-workers"])
        # medians 100 MiB/s, p50 50 µs, CPU 25 µs against kernel-tcp's 100, 50, 25
        self.assertTrue(by["iser-blk-ublk-tcp"].endswith("| 1.00× | 1.00× | 1.00× |"), by["iser-blk-ublk-tcp"])
        self.assertIn("25.0 [20.0–30.0]", by["iser-blk-ublk-tcp"])
        self.assertIn("| 4.50 [3.00–6.00] |", by["iser-blk-ublk-tcp"])
        self.assertIn("| – |", by["kernel-tcp"])  # no gateway, no count
        # against kernel-iser; no CPU file: no CPU ratio
        self.assertTrue(by["iser-blk-iser"].endswith("| 0.50× | 0.50× | – |"), by["iser-blk-iser"])
        self.assertIn("2 repetition(s) per cell", lines[-1])


if __name__ == "__main__":
    unittest.main()
