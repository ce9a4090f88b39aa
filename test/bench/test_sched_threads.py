"""Unit test of sched_threads.py on trace lines as tracefs writes them. Run by make test's py
tier (test/pyunit.py)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sched_threads  # noqa: E402

TRACE = """\
# tracer: nop
          <idle>-0       [001] dNh4.    60.692555: sched_wakeup: comm=iser-blk pid=381 prio=120 target_cpu=001
          <idle>-0       [001] d..2.    60.692593: sched_switch: prev_comm=swapper/1 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=iser-blk next_pid=381 next_prio=120
        iser-blk-381     [001] d..3.    60.692632: sched_wakeup: comm=iser-blk pid=393 prio=120 target_cpu=000
        iser-blk-381     [001] d..2.    60.692688: sched_switch: prev_comm=iser-blk prev_pid=381 prev_prio=120 prev_state=S ==> next_comm=fio next_pid=610 next_prio=120
        iser-blk-381     [001] .....    60.692640: sys_enter: NR 426 (3, 0, 1, 1, 0, 0)
        iser-blk-393     [000] .....    60.692650: sys_enter: NR 0 (7, c000123000, 1000, 0, 0, 0)
        iser-blk-393     [000] .....    60.692660: sys_enter: NR 1 (9, c000124000, 8, 0, 0, 0)
        iser-blk-381     [001] .....    60.692670: sys_enter: NR 426 (3, 1, 1, 1, 0, 0)
             fio-610     [000] .....    60.692680: sys_enter: NR 209 (7, 1, 0, 0, 0, 0)
        iser-blk-393     [000] .....    60.692690: sys_enter: NR 999 (0, 0, 0, 0, 0, 0)
     kworker/1:2-146     [001] d.h3.    60.694660: sched_wakeup: comm=iser-blk pid=381 prio=120 target_cpu=001
     kworker/1:2-146     [001] d..2.    60.695020: sched_switch: prev_comm=kworker/1:2 prev_pid=146 prev_prio=120 prev_state=I ==> next_comm=iser-blk next_pid=381 next_prio=120
             fio-610     [000] d..2.    60.695100: sched_switch: prev_comm=fio prev_pid=610 prev_prio=120 prev_state=S ==> next_comm=iser-blk next_pid=393 next_prio=120
"""


class AnalyseTest(unittest.TestCase):
    def test_switches_and_wakers(self):
        into, wakes, irq_times = sched_threads.analyse(TRACE.splitlines())
        self.assertEqual(dict(into), {"381": 2, "393": 1})
        # both wake-ups of 381 came in hard-interrupt context (flags d?h?): an interrupt on the
        # idle CPU, one while a kworker ran; 393 was woken by thread 381 itself
        self.assertEqual(dict(wakes), {("irq on <idle>", "381"): 1, ("iser-blk tid 381", "393"): 1,
                                       ("irq on kworker", "381"): 1})
        self.assertEqual(irq_times["381"], [60.692555, 60.694660])
        lines = sched_threads.report(into, wakes, irq_times, 2)
        self.assertIn("  381: 1.00", lines)
        self.assertIn("  irq on <idle> -> 381: 0.50", lines)
        self.assertIn("TID 381: µs between its wake-ups by interrupt: p10 2105, p50 2105, p90 2105", lines)

    def test_syscalls_of_the_gateway(self):
        # the gateway's threads' sys_enter lines by call name (fio's io_submit is not the
        # gateway's; an unknown number keeps its number), per I/O in the report
        calls = sched_threads.syscalls(TRACE.splitlines())
        self.assertEqual(dict(calls), {"io_uring_enter": 2, "read": 1, "write": 1, "NR 999": 1})
        lines = sched_threads.report_syscalls(calls, 2)
        self.assertEqual(lines[0], "system calls of the gateway's threads per I/O: 2.50, by call:")
        self.assertEqual(lines[1], "  io_uring_enter: 1.00")
        self.assertEqual(sched_threads.report_syscalls({}, 2), [])

    def test_tally_by_task(self):
        # switches into iser-blk (381, 381, 393), fio and swapper are not in TRACE: only the
        # tasks switched to count, CPU and worker numbers dropped
        self.assertEqual(dict(sched_threads.tally(TRACE.splitlines())), {"iser-blk": 3, "fio": 1})

    def test_task_names_as_the_tally(self):
        # bench-iser.sh's sed drops everything from / or : first, then trailing digits
        self.assertEqual(sched_threads.task("kworker/1:2H"), "kworker")
        self.assertEqual(sched_threads.task("jbd2/vda1-8"), "jbd")
        self.assertEqual(sched_threads.task("swapper/0"), "swapper")


if __name__ == "__main__":
    unittest.main()
