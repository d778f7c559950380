#!/usr/bin/env python3
"""perf/gpu/gpu_check_merge.py, perf/gpu_check's verdict: a step that failed or did not finish
fails the run, and on a host where PyTorch has CUDA a PyTorch step that did not run on the GPU
fails it too, unless the command line turned it off."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

MERGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_check_merge.py")
DRIVER = {"gpu": True, "ok": True, "torch": {"ok": True}}
UNFINISHED = {"ok": False, "error": "the kvwarm step did not finish: the run ended during it"}


class MergeTest(unittest.TestCase):
    def merge(self, steps, *flags, driver=DRIVER):
        """Runs the merge on the driver's JSON and the steps' (name: object or text); returns
        (exit code, gpu_check.json)."""
        with tempfile.TemporaryDirectory() as out:
            path = os.path.join(out, "driver.json")
            with open(path, "w") as f:
                f.write(driver if isinstance(driver, str) else json.dumps(driver))
            for name, step in steps.items():
                with open(os.path.join(out, f"{name}.json"), "w") as f:
                    f.write(step if isinstance(step, str) else json.dumps(step) + "\n")
            r = subprocess.run([sys.executable, MERGE, "--driver", path, "--out", out, *flags],
                               capture_output=True, text=True)
            self.assertEqual(r.stderr, "")
            with open(os.path.join(out, "gpu_check.json")) as f:
                return r.returncode, json.load(f)

    def test_steps_that_passed_keep_the_run_ok(self):
        rc, result = self.merge({"serve": {"ok": True}, "kvwarm": {"ok": True}}, "--torch-cuda")
        self.assertEqual((rc, result["ok"]), (0, True))
        self.assertEqual(result["serve"], {"ok": True})
        self.assertNotIn("torch_skipped", result)
        self.assertIn("error", result["header_reads"])  # no benchmark here: said, not failed

    def test_a_step_that_did_not_finish_fails_the_run_and_the_finished_one_is_kept(self):
        rc, result = self.merge({"serve": {"ok": True, "lost": 0}, "kvwarm": UNFINISHED})
        self.assertEqual((rc, result["ok"]), (1, False))
        self.assertEqual(result["serve"], {"ok": True, "lost": 0})
        self.assertEqual(result["kvwarm"], UNFINISHED)

    def test_a_step_not_reached_is_absent_and_a_broken_line_fails(self):
        rc, result = self.merge({"serve": "Traceback (most recent call last):\n"})
        self.assertEqual((rc, result["ok"]), (1, False))
        self.assertIn("not a JSON object", result["serve"]["error"])
        self.assertNotIn("kvwarm", result)

    def test_skipped_steps_pass_where_pytorch_has_no_cuda(self):
        skipped = {"skipped": "this PyTorch (1.13) has no usable CUDA"}
        rc, result = self.merge({"serve": skipped, "kvwarm": skipped},
                                "--torch-unusable", "this PyTorch (1.13) has no usable CUDA")
        self.assertEqual((rc, result["ok"]), (0, True))
        self.assertNotIn("torch_skipped", result)

    def test_skipped_steps_fail_where_pytorch_has_cuda(self):
        why = "PyTorch cannot wrap CUDA memory through DLPack here: boom"
        rc, result = self.merge({"serve": {"skipped": why}, "kvwarm": {"skipped": why}},
                                "--torch-cuda", "--torch-unusable", why)
        self.assertEqual((rc, result["ok"]), (1, False))
        self.assertEqual(set(result["torch_skipped"]["steps"]), {"torch", "serve", "kvwarm"})
        self.assertIn(why, result["torch_skipped"]["steps"]["torch"])

    def test_steps_turned_off_on_the_command_line_do_not_fail(self):
        rc, result = self.merge({"serve": {"skipped": "--no-serve"}, "kvwarm": {"ok": True}},
                                "--torch-cuda", "--asked-off", "serve,")
        self.assertEqual((rc, result["ok"]), (0, True))
        rc, result = self.merge({"serve": {"skipped": "--no-serve"}}, "--torch-cuda")
        self.assertEqual((rc, result["torch_skipped"]["steps"]), (1, {"serve": "--no-serve"}))

    def test_the_drivers_own_failure_is_kept_and_its_exit_is_the_drivers(self):
        driver = dict(DRIVER, ok=False, error="deadline of 200 s passed during step pair")
        rc, result = self.merge({}, driver=driver)
        self.assertEqual((rc, result["ok"], result["error"]), (0, False, driver["error"]))
        rc, result = self.merge({}, driver='{"gpu": true, "ok": tr')
        self.assertEqual(result["ok"], False)
        self.assertIn("does not parse", result["error"])


if __name__ == "__main__":
    unittest.main()
