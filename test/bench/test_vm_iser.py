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


class LatencyTest(unittest.TestCase):
    def test_total_latency_is_preferred_to_completion_latency(self):
        with tempfile.TemporaryDirectory() as out:
            g = os.path.join(out, "guest")
            os.makedirs(g)
            j = fio_json(1000, 4, 15)  # clat p50 15 µs: the part after io_submit returned
            j["jobs"][0]["read"]["lat_ns"] = {"percentile": {"50.000000": 250_000}}
            json.dump(j, open(os.path.join(g, "1-randread-4k-qd1-iser-blk-ublk-mem.json"), "w"))
            json.dump(fio_json(1000, 4, 300), open(os.path.join(g, "1-randread-4k-qd1-kernel-tcp.json"), "w"))
            runs = vm_iser.load(out)
        self.assertEqual(runs[("randread-4k-qd1", "iser-blk-ublk-mem")][0]["p50"], 250.0)
        self.assertEqual(runs[("randread-4k-qd1", "kernel-tcp")][0]["p50"], 300.0)  # older files: clat


class BoundsTest(unittest.TestCase):
    def test_floors_and_copies_make_the_bounds(self):
        with tempfile.TemporaryDirectory() as out:
            g = os.path.join(out, "guest")
            os.makedirs(g)
            # job → system → (iops, MiB/s, p50 µs, CPU µs per I/O)
            runs = {
                "seqwrite-1m-qd8": {"iser-blk-ublk-tcp": (100, 100, 80000, 14000),
                                    "kernel-tcp": (250, 250, 30000, 6000),
                                    "iser-blk-ublk-mem": (900, 900, 7000, 1300)},
                "randread-4k-qd1": {"iser-blk-ublk-tcp": (900, 3.5, 1000, 1400), "kernel-tcp": (3000, 11, 300, 400),
                                    "iser-blk-ublk-mem": (2000, 8, 450, 600), "kernel-ram": (8000, 31, 100, 120)},
                "randread-4k-qd32": {"iser-blk-ublk-tcp": (6000, 23, 4000, 200), "kernel-tcp": (8000, 31, 3000, 150),
                                     "iser-blk-ublk-mem": (20000, 78, 1500, 60), "kernel-ram": (50000, 195, 600, 20),
                                     "iser-blk-ublk-iser": (5000, 20, 5000, 250), "kernel-iser": (7000, 27, 3500, 170)},
            }
            for job, systems in runs.items():
                for s, (iops, mib, p50, cpu) in systems.items():
                    f = os.path.join(g, f"1-{job}-{s}.json")
                    json.dump(fio_json(iops, mib, p50, write="write" in job), open(f, "w"))
                    open(f + ".cpu", "w").write(f"{cpu}\n")
            for rep, (tx, rx) in ((1, (5000.0, 3000.0)), (2, (6000.0, 4000.0)), (3, (5700.0, 3500.0))):
                open(os.path.join(g, f"tcp-{rep}.txt"), "w").write(f"{tx} {rx}\n")
            lines = vm_iser.bounds(vm_iser.load(out), vm_iser.load_tcp(out))
        by = {l.split(" | ")[0][2:]: l.split(" | ") for l in lines if l.startswith("| ") and "---" not in l}
        # 1 MiB write: floor 1300 (ublk on mem://) + 5700 (TCP send) = 7000 µs; speed bound
        # 6000/7000 = 0.86, measured 0.40
        w = by["seqwrite-1m-qd8: speed"]
        self.assertEqual((w[2], w[3], w[4]), ("0.40×", "0.86×", "0.47"))
        self.assertIn("gateway CPU floor 7000 µs per I/O = iser-blk-ublk-mem 1300 + TCP send 5700, kernel 6000", w[5])
        self.assertIn("busy vCPUs: kernel 1.50, gateway 1.40", w[5])
        c = by["seqwrite-1m-qd8: CPU per I/O"]
        self.assertEqual((c[2], c[3], c[4]), ("2.33×", "1.17×", "0.50"))
        # QD1: sound 450/300; estimate 450 + 300 − 100 = 650 → 2.17×; measured 1000/300
        self.assertEqual(by["randread-4k-qd1: p50 (sound)"][2:5], ["3.33×", "1.50×", "0.45"])
        self.assertEqual(by["randread-4k-qd1: p50 (estimate)"][2:5], ["3.33×", "2.17×", "0.65"])
        # QD32: CPU floor 60 + 150 − 20 = 190 → IOPS bound 150/190 = 0.79, measured 0.75
        self.assertEqual(by["randread-4k-qd32: IOPS (estimate)"][2:5], ["0.75×", "0.79×", "0.95"])
        self.assertEqual(by["randread-4k-qd32: CPU per I/O (estimate)"][2:5], ["1.33×", "1.27×", "0.95"])
        # over iSER, against kernel-iser: floor 60 + 170 − 20 = 210 → IOPS bound 170/210 = 0.81,
        # measured 5000/7000 = 0.71; CPU 250/170 = 1.47 against 210/170 = 1.24
        self.assertEqual(by["randread-4k-qd32 over iSER: IOPS (estimate)"][2:5], ["0.71×", "0.81×", "0.88"])
        self.assertEqual(by["randread-4k-qd32 over iSER: CPU per I/O (estimate)"][2:5], ["1.47×", "1.24×", "0.84"])
        self.assertIn("CPU floor 210 µs = iser-blk-ublk-mem 60 + kernel 170 − kernel-ram 20",
                      by["randread-4k-qd32 over iSER: IOPS (estimate)"][5])
        # no reads measured: the row says so instead of inventing a figure
        self.assertEqual(by["seqread-1m-qd8: speed"][2:5], ["–", "–", "–"])
        self.assertIn("A MiB over loopback TCP between two processes: 5700 µs of guest CPU to send, 3500 to "
                      "receive (medians of 3)", lines[-1])


class CountersTest(unittest.TestCase):
    def test_counters_per_io_medians(self):
        with tempfile.TemporaryDirectory() as out:
            g = os.path.join(out, "guest")
            os.makedirs(g)
            for rep, ctxt, wrs in [(1, 2.0, 3.0), (2, 4.0, 5.0), (3, 3.0, 4.0)]:
                f = os.path.join(g, f"{rep}-randread-4k-qd32-iser-blk-ublk-iser.json")
                json.dump(fio_json(1000, 4, 100), open(f, "w"))
                json.dump({"ctxt": ctxt, "sent_pkts": 1.0, "rcvd_pkts": 2.0,
                           "rdma": {"send_work_requests": wrs, "send_posts": 0.5, "completions": 2.0,
                                    "completion_events": 0.25}}, open(f + ".ctr", "w"))
            f = os.path.join(g, "1-randread-4k-qd32-kernel-iser.json")
            json.dump(fio_json(2000, 8, 50), open(f, "w"))
            json.dump({"ctxt": 1.5, "sent_pkts": 1.0, "rcvd_pkts": 2.0, "rdma": None}, open(f + ".ctr", "w"))
            lines = vm_iser.counters_table(vm_iser.load(out))
        by = {l.split(" | ")[1]: l for l in lines if l.startswith("| randread-4k-qd32 |")}
        # medians: ctxt 3, send WRs 4; the kernel has no verbs counters of ours
        self.assertEqual(by["iser-blk-ublk-iser"],
                         "| randread-4k-qd32 | iser-blk-ublk-iser | 3.00 | 1.00 | 2.00 | 4.00 | 0.50 | – | – | 2.00 | 0.25 |")
        self.assertEqual(by["kernel-iser"], "| randread-4k-qd32 | kernel-iser | 1.50 | 1.00 | 2.00 | – | – | – | – | – | – |")

    def test_switches_per_io_by_task(self):
        with tempfile.TemporaryDirectory() as out:
            g = os.path.join(out, "guest")
            os.makedirs(g)
            for rep, gw in [(1, 10.0), (2, 14.0), (3, 12.0)]:
                f = os.path.join(g, f"{rep}-randread-4k-qd1-iser-blk-ublk-tcp.json")
                json.dump(fio_json(1000, 4, 100), open(f, "w"))
                json.dump({"overrun": rep - 1, "into": {"iser-blk": gw, "swapper": 8.0, "fio": 2.0,
                                                       "iscsi_trx": 1.0, "iscsi_ttx": 0.5}},
                          open(f + ".sched", "w"))
            f = os.path.join(g, "1-randread-4k-qd1-kernel-tcp.json")
            json.dump(fio_json(2000, 8, 50), open(f, "w"))
            json.dump({"overrun": 0, "into": {"kworker": 2.0, "swapper": 2.0, "fio": 1.0}}, open(f + ".sched", "w"))
            runs = vm_iser.load(out)
            lines = vm_iser.sched_table(runs)
            self.assertEqual(vm_iser.sched_table(runs), lines)  # the runs are left as they were
        by = {l.split(" | ")[1]: l for l in lines if l.startswith("| randread-4k-qd1 |")}
        # medians: gateway 12, all 23.5; others = iscsi_trx + iscsi_ttx; the most events any run lost
        self.assertEqual(by["iser-blk-ublk-tcp"],
                         "| randread-4k-qd1 | iser-blk-ublk-tcp | 23.50 | 12.00 | 8.00 | 0.00 | 2.00 | 1.50 | 2 |")
        self.assertEqual(by["kernel-tcp"], "| randread-4k-qd1 | kernel-tcp | 5.00 | 0.00 | 2.00 | 2.00 | 1.00 | 0.00 | 0 |")

    def test_no_counters_no_table(self):
        with tempfile.TemporaryDirectory() as out:
            g = os.path.join(out, "guest")
            os.makedirs(g)
            json.dump(fio_json(1000, 4, 100), open(os.path.join(g, "1-randread-4k-qd32-kernel-iser.json"), "w"))
            self.assertEqual(vm_iser.counters_table(vm_iser.load(out)), [])
            self.assertEqual(vm_iser.sched_table(vm_iser.load(out)), [])


if __name__ == "__main__":
    unittest.main()
