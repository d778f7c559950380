"""The stack that perf/soak runs and the faults it injects into it.

The stack is `make serve`'s (scripts/serve): baton-controller with a primary and a standby
engine (the reference engine on the small model by default, or baton-torch-engine) and
baton-router in front, with the same controller config. Like scripts/serve's supervisor loop
(and systemd's Restart=always with WatchdogSec), a controller that exits is started again, and
one that has answered `batonctl status` before and then stays silent for --watchdog-s is killed
with kill -9 and started again. The runtime directory is private to the run.

Every process it starts, and every engine the controllers launch, is stopped by stop(), which
the caller runs on every exit path. Once stop() has begun, nothing starts another process, and
the waits of a fault in progress end with a RuntimeError.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request

from baton_perf import (ROOT, batonctl, children_of, engines_of, free_port, metric,
                        pair_ready, serving_primary, signal_same, start_time, stop_processes)

FAULTS = ["engine-kill", "engine-hang", "controller-kill", "controller-hang", "keeper-kill",
          "router-restart", "upgrade", "rollback"]


class Stack:
    def __init__(self, args, bin_dir, model_dir, log):
        self.args, self.bin, self.model_dir, self.log = args, bin_dir, model_dir, log
        self.runtime = tempfile.mkdtemp(prefix="baton-soak.", dir="/tmp")
        self.socket = os.path.join(self.runtime, "controller.sock")
        # Every process of the stack seen, as (pid, start time): stop() signals a pid only while
        # it is still the process seen, not one that took the pid after it (baton_perf.start_time).
        self.procs, self.seen = [], set()
        self.lock = threading.Lock()
        self.controller = self.router = None
        self.controller_starts = 0
        self.watchdog_kills = 0
        self.upgrades = 0
        self.canary_promoted = None  # the last canary's end: promoted (True) or rolled back
        self.router_before = {"replay": 0, "retry": 0}  # by the routers stopped so far
        self.stop_event = threading.Event()
        self.port = free_port()

    # --- processes --------------------------------------------------------------------------

    def engine_command(self, version):
        if self.args.engine == "torch":
            # A GPU step costs its kernels' launches more than its rows: a larger batch keeps
            # up with the rate where a CPU's would fall behind.
            batch = "8" if self.args.device == "cpu" else "32"
            return [os.path.join(ROOT, "python/bin/baton-torch-engine"), "--model", "{model_dir}",
                    "--port", "{port}", "--controller", "{socket}", "--token", "{token}",
                    "--role", "{role}", "--engine-id", "{engine_id}", "--served-model-name",
                    "baton-default", "--device", self.args.device, "--max-batch", batch,
                    "--engine-version", version] + list(getattr(self.args, "engine_flags", []))
        return [os.path.join(self.bin, "baton-refengine"), "--model", "{model_dir}", "--port",
                "{port}", "--controller", "{socket}", "--token", "{token}", "--role", "{role}",
                "--engine-id", "{engine_id}", "--served-model-name", "baton-default",
                "--engine-version", version]

    def write_config(self):
        path = os.path.join(self.runtime, "controller.toml")
        gpu = '\n[gpu]\nbackend = "cuda"\n' if self.args.device.startswith("cuda") else ""
        engine = self.engine_command("soak-0")
        if self.args.engine == "torch":
            engine = ["/usr/bin/env", "BATON_LIB_DIR=" + os.path.join(
                os.path.dirname(self.bin), "lib")] + engine
        with open(path, "w") as f:
            f.write(f"[controller]\nruntime_dir = {json.dumps(self.runtime)}\n\n"
                    f"[model]\ndir = {json.dumps(self.model_dir)}\n\n"
                    f"[engine]\ncommand = {json.dumps(engine)}\n"
                    f"log_dir = {json.dumps(os.path.join(self.args.out, 'engines'))}\n"
                    f"register_timeout_ms = 120000\n\n"
                    f'[pool]\nblocks = 256\nblock_bytes = "2MiB"\n{gpu}')
        return path

    def spawn(self, argv, log_name):
        with self.lock, open(os.path.join(self.args.out, log_name), "ab") as f:
            self.check_running()
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            self.procs.append(proc)
        return proc

    def check_running(self):
        if self.stop_event.is_set():
            raise RuntimeError("the stack is stopping")

    def note(self, pid):
        """Adds `pid` to the processes seen, with its start time read now (a pid the controller
        reported a moment ago: it comes round again only after minutes)."""
        start = start_time(pid)
        if start is not None:
            with self.lock:
                self.seen.add((pid, start))

    def start(self):
        os.makedirs(os.path.join(self.args.out, "engines"), exist_ok=True)
        self.config = self.write_config()
        self.start_controller()
        self.wait_ready(None, 180)
        self.start_router()
        threading.Thread(target=self.supervise, daemon=True).start()

    def start_controller(self):
        self.controller = self.spawn([os.path.join(self.bin, "baton-controller"), "--config",
                                      self.config], "controller.log")
        self.controller_starts += 1

    def start_router(self):
        self.router = self.spawn([os.path.join(self.bin, "baton-router"), "--listen",
                                  f"127.0.0.1:{self.port}", "--controller", self.socket],
                                 "router.log")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self.check_running()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("baton-router never answered /health; see router.log")

    def supervise(self):
        """scripts/serve's supervisor loop: restart on exit, kill -9 after a silence."""
        answered_at = None
        while not self.stop_event.wait(0.25):
            ctl = self.controller
            if ctl.poll() is not None:
                self.log(f"baton-controller (pid {ctl.pid}) exited with {ctl.returncode}: "
                         "starting it again")
                answered_at = None
                self.start_controller()
                continue
            try:
                rc, _, _ = batonctl(self.bin, self.socket, "--timeout-ms", "1000", "status",
                                    timeout=5)
            except subprocess.TimeoutExpired:
                rc = -1
            now = time.monotonic()
            if rc == 0:
                answered_at = now
            elif answered_at is not None and now - answered_at >= self.args.watchdog_s:
                self.log(f"baton-controller (pid {ctl.pid}) silent for "
                         f"{now - answered_at:.1f} s: kill -9")
                ctl.send_signal(signal.SIGKILL)  # a Popen: never signals a reaped pid
                self.watchdog_kills += 1
                answered_at = None

    def status(self):
        try:
            s = batonctl(self.bin, self.socket, "status")[1]
        except subprocess.TimeoutExpired:
            return {}
        for e in s.get("engines", []):
            if e.get("pid"):
                self.note(int(e["pid"]))
        keeper = s.get("controller", {}).get("keeper", {}).get("pid", 0)
        if keeper:
            self.note(int(keeper))
        return s

    def wait_ready(self, old_primary, limit_s):
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            self.check_running()
            s = self.status()
            if pair_ready(s, old_primary):
                return s
            time.sleep(0.05)
        raise RuntimeError(f"the pair was not ready within {limit_s} s; see controller.log")

    def router_counts(self):
        """The running router's replays and retries (an interrupted request sent again after
        some tokens, or before any)."""
        return {kind: metric(self.port, f'baton_router_replays_total{{kind="{kind}"}}')
                for kind in ("replay", "retry")}

    def daemon_pids(self, s):
        """{"controller": pid, "router": pid, "keeper": pid} of the processes running now, the
        keeper's from `s`, a status of this stack."""
        pids = {"controller": self.controller.pid, "router": self.router.pid}
        keeper = s.get("controller", {}).get("keeper", {}).get("pid", 0)
        if keeper:
            pids["keeper"] = int(keeper)
        return pids

    def engines_now(self):
        """(pid, start time) of the engines launched on this stack's socket, running now."""
        return {(pid, start) for pid in engines_of(self.socket)
                if (start := start_time(pid)) is not None}

    def stop(self):
        with self.lock:  # after this, spawn() starts nothing
            self.stop_event.set()
            procs = list(self.procs)
            others = set(self.seen)
        stop_processes(procs, others | self.engines_now(), self.log)
        for pid, start in self.engines_now():  # engines started while the stack stopped
            if signal_same(pid, start, signal.SIGKILL):
                self.log(f"killed engine {pid}, left after the stack stopped")
        for pid in children_of(os.getpid()):  # a child whose Popen a signal cut short
            if signal_same(pid, None, signal.SIGKILL):
                self.log(f"killed pid {pid}, a child left after the stack stopped")
        shutil.rmtree(self.runtime, ignore_errors=True)

    # --- faults -----------------------------------------------------------------------------

    def inject(self, kind):
        """Waits for a ready pair, injects one fault into it and waits for the pair to be ready
        again; returns a record."""
        before = self.wait_ready(None, 120)
        primary = serving_primary(before) or {}
        t0 = time.monotonic()
        detail = getattr(self, "_" + kind.replace("-", "_"))(before, primary)
        old = primary.get("id") if kind in ("engine-kill", "engine-hang",
                                           "controller-hang") else None
        after = self.wait_ready(old, 120)
        record = {"fault": kind, "detail": detail, "injected_at": t0,
                  "ready_after_ms": round((time.monotonic() - t0) * 1000, 1),
                  "primary": serving_primary(after).get("id")}
        if kind == "upgrade":  # promoted, or rolled back by its judge instead
            record["promoted"] = self.canary_promoted
        if old is not None:  # a failover: the controller's phases of it
            record["timeline"] = batonctl(self.bin, self.socket, "timeline")[1].get("timeline")
        return record

    def _engine_kill(self, _, primary):
        os.kill(int(primary["pid"]), signal.SIGKILL)
        return f"kill -9 of primary {primary['id']}"

    def _engine_hang(self, _, primary):
        os.kill(int(primary["pid"]), signal.SIGSTOP)
        return f"SIGSTOP of primary {primary['id']}"

    def _controller_kill(self, *_):
        pid = self.controller.pid
        self.controller.send_signal(signal.SIGKILL)
        return f"kill -9 of baton-controller {pid}"

    def _controller_hang(self, _, primary):
        pid = self.controller.pid
        self.controller.send_signal(signal.SIGSTOP)
        time.sleep(0.5)
        os.kill(int(primary["pid"]), signal.SIGKILL)
        return f"SIGSTOP of baton-controller {pid}, then kill -9 of primary {primary['id']}"

    def _keeper_kill(self, before, _):
        pid = before.get("controller", {}).get("keeper", {}).get("pid", 0)
        if not pid:
            return "no baton-keeper running"
        os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + 30  # the controller starts a new one
        while time.monotonic() < deadline:
            self.check_running()
            k = self.status().get("controller", {}).get("keeper", {})
            if k.get("pid") and k.get("pid") != pid and k.get("state") == "keeping":
                return f"kill -9 of baton-keeper {pid}; the controller started {k['pid']}"
            time.sleep(0.1)
        raise RuntimeError(f"no new baton-keeper within 30 s of killing {pid}")

    def _router_restart(self, *_):
        old = self.router
        for kind, n in self.router_counts().items():
            self.router_before[kind] += n
        old.send_signal(signal.SIGTERM)
        old.wait(timeout=60)
        self.start_router()
        return f"baton-router {old.pid} stopped (exit {old.returncode}), {self.router.pid} started"

    def _upgrade(self, *_):
        return self.canary(rollback=False)

    def _rollback(self, *_):
        return self.canary(rollback=True)

    def canary(self, rollback):
        self.upgrades += 1
        version = f"soak-{self.upgrades}"
        before = self.status().get("upgrade", {})
        done_key = "rolled_back" if rollback else "promoted"
        step_ms = "60000" if rollback else "1000"
        rc, _, text = batonctl(self.bin, self.socket, "upgrade", "--steps", "50,100",
                               "--step-ms", step_ms, "--min-requests", "1", "--",
                               *self.engine_command(version))
        if rc != 0:
            raise RuntimeError(f"batonctl upgrade refused: {text.strip()[-300:]}")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            self.check_running()
            u = self.status().get("upgrade", {})
            current = u.get("current") or {}
            if rollback and current.get("phase") == "canary":
                rc, _, text = batonctl(self.bin, self.socket, "rollback")
                if rc != 0:
                    raise RuntimeError(f"batonctl rollback refused: {text.strip()[-300:]}")
                rollback = None  # sent once
            if not current and u.get(done_key, 0) > before.get(done_key, 0):
                self.canary_promoted = done_key == "promoted"
                return f"canary {version} {done_key.replace('_', ' ')}"
            if not current and done_key == "promoted" and \
                    u.get("rolled_back", 0) > before.get("rolled_back", 0):
                # The judge rolled the canary back (it failed on a starved host, say): the pair
                # serves on the old command, which is what a rollback is for; no request is lost.
                self.canary_promoted = False
                return f"canary {version} rolled back instead: {last_reason(u)}"
            time.sleep(0.1)
        raise RuntimeError(f"the canary {version} did not finish within 120 s")


def last_reason(upgrade_status):
    """The reason of the latest upgrade in `batonctl status --json`'s upgrade history."""
    history = upgrade_status.get("history") or []
    return str(history[-1].get("reason", "no reason given")) if history else "no history"


def schedule(kinds, count, seed):
    """`count` faults: every kind once in a shuffled order, then again, and so on."""
    rng, out = random.Random(seed), []
    while len(out) < count:
        round_ = list(kinds)
        rng.shuffle(round_)
        out.extend(round_)
    return out[:count]


def run_faults(stack, kinds, every_s, seed, start, until, records, errors, stop, log,
               clock=time.monotonic):
    """Injects the faults of schedule(kinds) into `stack` from `start` until `until`, appending
    each record (with `injected_at_s`, seconds after `start`) to `records`. `every_s` is the
    least quiet time before each fault: the first comes `every_s` after `start`, each next one
    `every_s` after the previous one has recovered (the pair ready again), so a slow recovery
    (a canary's steps, a router's drain) delays the next fault instead of leaving the faults
    behind it to fire back to back. None is injected later than 5 s before `until`. Ends at
    the first fault the stack does not recover from (its error appended to `errors`), or
    once `stop` (a threading.Event) is set."""
    at = start + every_s
    for kind in schedule(kinds, 1_000_000, seed):
        if at > until - 5 or stop.wait(max(0.0, at - clock())):
            return
        try:
            r = stack.inject(kind)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            if not stop.is_set():  # not a fault cut short by the end of the run
                log(f"{kind}: {e}")
                errors.append(f"{kind}: {e}")
            return
        r["injected_at_s"] = round(r.pop("injected_at") - start, 1)
        log(f"{r['fault']}: {r['detail']}; ready again after {r['ready_after_ms']} ms")
        records.append(r)
        at = clock() + every_s


def steady(status):
    """Whether `status` shows the pair whole and alone: ready, a serving primary and one
    standby, no other engine (a failover's gap or a canary changes the controller's fds by
    an engine's socket, pidfd, liveness page and cgroup)."""
    return pair_ready(status) and len(status.get("engines", [])) == 2
