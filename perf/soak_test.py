#!/usr/bin/python3
"""perf/soak's pure parts: a process's start time from /proc/PID/stat, the identity check
before a signal, the fault timetable, and the judgement of the daemons' resource growth."""
import os
import signal
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from baton_perf import alive, parse_start_time, signal_same, start_time  # noqa: E402
from soak_report import NOT_JUDGED, resources, resources_bounded  # noqa: E402
from soak_stack import run_faults  # noqa: E402


def stat_line(comm, start):
    fields = ["S", "1", "2", "2", "0", "-1", "4194304"] + ["0"] * 12 + [str(start), "1000"]
    return f"4242 ({comm}) " + " ".join(fields) + "\n"


class StartTime(unittest.TestCase):
    def test_field_22(self):
        self.assertEqual(parse_start_time(stat_line("baton-router", 98765)), 98765)

    def test_a_command_name_with_spaces_and_parentheses(self):
        self.assertEqual(parse_start_time(stat_line("a) (b c) 1 2", 555)), 555)

    def test_this_process(self):
        self.assertIsNotNone(start_time(os.getpid()))
        self.assertTrue(alive(os.getpid(), start_time(os.getpid())))

    def test_a_gone_process(self):
        p = subprocess.Popen(["/bin/true"])
        p.wait()
        self.assertIsNone(start_time(p.pid))
        self.assertFalse(alive(p.pid))


class SignalSame(unittest.TestCase):
    def test_signals_only_the_process_that_started_then(self):
        p = subprocess.Popen(["/bin/sleep", "30"])
        try:
            start = start_time(p.pid)
            self.assertFalse(signal_same(p.pid, start + 1, signal.SIGKILL))
            self.assertIsNone(p.poll())
            self.assertTrue(signal_same(p.pid, start, signal.SIGKILL))
            self.assertEqual(p.wait(timeout=10), -signal.SIGKILL)
        finally:
            p.kill()
            p.wait()


class Clock:
    """A fake monotonic clock and stop event: waiting advances the clock."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def wait(self, seconds):
        self.now += seconds
        return False

    def is_set(self):
        return False


class FakeStack:
    def __init__(self, clock, recover_s):
        self.clock, self.recover_s, self.injected = clock, list(recover_s), []

    def inject(self, kind):
        t0 = self.clock()
        self.injected.append(t0)
        self.clock.now += self.recover_s.pop(0)
        return {"fault": kind, "detail": "", "injected_at": t0,
                "ready_after_ms": (self.clock() - t0) * 1000}


class Faults(unittest.TestCase):
    def run_faults(self, recover_s, every_s, duration_s):
        clock = Clock()
        stack, records, errors = FakeStack(clock, recover_s), [], []
        run_faults(stack, ["a", "b"], every_s, 1, clock(), clock() + duration_s, records,
                   errors, clock, lambda _: None, clock=clock)
        return stack.injected, records, errors

    def test_a_slow_recovery_delays_the_next_fault(self):
        injected, records, errors = self.run_faults([40, 1, 30] + [1] * 10, 8, 150)
        self.assertEqual(errors, [])
        # Due at 8; recovered at 48, so the next at 56; recovered at 57, next at 65; none
        # after 145, 5 s before the end.
        self.assertEqual([r["injected_at_s"] for r in records], [8, 56, 65, 103, 112, 121, 130, 139])
        ends = [t + r for t, r in zip(injected, [40, 1, 30, 1])]
        for end, nxt in zip(ends, injected[1:]):
            self.assertGreaterEqual(nxt - end, 8)

    def test_none_within_5_s_of_the_end(self):
        _, records, _ = self.run_faults([1] * 10, 8, 30)
        self.assertEqual([r["injected_at_s"] for r in records], [8, 17])


def samples(role, pid, start, t0, t1, rss, fds=10, every=5):
    return [(t, role, rss(t - t0), fds, pid, start) for t in range(t0, t1 + 1, every)]


class Growth(unittest.TestCase):
    def test_restarted_daemons_are_judged_by_their_longest_lived_process(self):
        # A router restarted at 200 s: the new one is larger, which is no growth.
        s = samples("router", 11, 1, 0, 195, lambda _: 8000)
        s += samples("router", 12, 2, 200, 600, lambda _: 9000)
        r = resources(s, 100)["router"]
        self.assertEqual((r["pid"], r["instances"], r["verdict"]), (12, 2, "bounded"))
        self.assertEqual(r["lived_s"], 400)
        self.assertEqual(resources_bounded({"router": r}), True)

    def test_growth_within_one_process(self):
        r = resources(samples("keeper", 7, 1, 0, 600, lambda t: 4000 + 2 * t), 100)["keeper"]
        self.assertEqual(r["verdict"], "grew")
        self.assertFalse(r["rss_kib"]["bounded"])
        self.assertEqual(resources_bounded({"keeper": r}), False)

    def test_no_process_lived_two_windows(self):
        s = samples("controller", 5, 1, 0, 150, lambda _: 10000)
        s += samples("controller", 6, 2, 155, 300, lambda _: 10000)
        res = resources(s, 100)
        self.assertEqual(res["controller"]["verdict"], NOT_JUDGED)
        self.assertNotIn("rss_kib", res["controller"])
        self.assertEqual(resources_bounded(res), NOT_JUDGED)

    def test_fds_are_judged_on_steady_samples_when_both_windows_have_some(self):
        # The controller's fds drop by an engine's during a failover's gap early on, and the
        # last window has none: steady samples alone show no growth.
        s = [(t, "controller", 10000, 23 if t == 20 else 29, 5, 1, t != 20)
             for t in range(0, 301, 5)]
        r = resources(s, 100)["controller"]
        self.assertEqual(r["fds"]["first"], 29)
        self.assertEqual(r["verdict"], "bounded")
        # A real leak grows the steady floor too.
        s = [(t, "controller", 10000, 29 + t // 10, 5, 1, True) for t in range(0, 301, 5)]
        self.assertEqual(resources(s, 100)["controller"]["verdict"], "grew")
        # No steady sample in one window: every sample counts.
        s = [(t, "controller", 10000, 23 if t == 20 else 29, 5, 1, t > 200)
             for t in range(0, 301, 5)]
        self.assertEqual(resources(s, 100)["controller"]["fds"]["first"], 23)

    def test_a_pid_used_again_is_another_process(self):
        s = samples("keeper", 9, 1, 0, 150, lambda _: 4000)
        s += samples("keeper", 9, 2, 155, 300, lambda _: 8000)
        self.assertEqual(resources(s, 100)["keeper"]["instances"], 2)
        self.assertEqual(resources(s, 100)["keeper"]["verdict"], NOT_JUDGED)


if __name__ == "__main__":
    unittest.main()
