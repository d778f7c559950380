"""Helpers shared by the Python programs in perf/ (perf/replay_torch, perf/soak): completions
through a router, compared token for token; the controller's status through batonctl; the
processes of a stack, found and stopped on every exit path.

Nothing here starts a process on import.
"""
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_start_time(stat):
    """Field 22 (starttime: clock ticks after boot) of a /proc/PID/stat line. Field 2, the
    command name in parentheses, may itself hold spaces and parentheses, so the fields are
    counted after its last ')': the first of them is field 3."""
    return int(stat.rsplit(")", 1)[1].split()[22 - 3])


def _state_and_start(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat.rsplit(")", 1)[1].split()[0], parse_start_time(stat)
    except (OSError, IndexError, ValueError):
        return None, None


def start_time(pid):
    """The start time of `pid` (parse_start_time), or None when no such process runs. A pid
    and its start time name one process: a pid is handed out again once its process is reaped
    (the kernel's pids wrap in about half an hour on a busy machine, the length of a soak)."""
    return _state_and_start(pid)[1]


def alive(pid, start=None):
    """Whether `pid` runs (not gone, not a zombie waiting for its reaper) and, given `start`,
    is still the process that started then (start_time), not a newer one with its pid."""
    state, started = _state_and_start(pid)
    return state is not None and state != "Z" and (start is None or started == start)


def signal_same(pid, start, sig):
    """Sends `sig` to `pid` only while it is the process that started at `start`; True if it
    was sent. The pidfd is opened before the start time is read: it pins the process that
    had the pid then, so the signal cannot reach a process that took the pid after the check
    (os.kill by pid could). Without pidfds (Linux before 5.3) the check and os.kill leave a
    window of microseconds, against the minutes a pid takes to come round again."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):
        fd = None
    try:
        if not alive(pid, start):
            return False
        if fd is None:
            os.kill(pid, sig)
        else:
            signal.pidfd_send_signal(fd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


def children_of(parent):
    """Pids of the live processes whose parent is `parent`. A child's pid cannot be handed out
    again before its parent reaps it, so a child of this process needs no start time."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[1]) == parent:
            pids.append(int(entry))
    return pids


def free_port():
    """A port free on 127.0.0.1 now, drawn below the kernel's ephemeral range: a port the
    kernel picked and released may be taken by another program's connection before the server
    this is for binds it (tests/support/free_port.h draws the same way)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(500):
        port = random.randint(10000, min(low, 65536) - 1)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def complete(port, body, timeout=300):
    """One completion through the server at 127.0.0.1:`port`, streamed or not as `body` says:
    ("ok", token ids), or ("failed", reason) for an HTTP error or an error event, or
    ("lost", reason) when no complete answer came, or ("refused", reason) when the connection
    was refused (no server listened: the request was never accepted)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        try:
            conn.request("POST", "/v1/completions", json.dumps(body),
                         {"Content-Type": "application/json"})
        except ConnectionRefusedError as e:
            return "refused", str(e)
        r = conn.getresponse()
        if r.status != 200:
            return "failed", f"HTTP {r.status}: {r.read()[:200]!r}"
        if not body.get("stream"):
            answer = json.loads(r.read())
            if "error" in answer:
                return "failed", str(answer["error"])[:200]
            return "ok", answer["choices"][0].get("token_ids", [])
        ids, done = [], False
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                done = True
                break
            event = json.loads(line[6:])
            if "error" in event:
                return "failed", event["error"].get("message", "an error event")
            for c in event.get("choices", []):
                ids.extend(c.get("token_ids", []))
        return ("ok", ids) if done else ("lost", "the stream ended without [DONE]")
    except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError) as e:
        return "lost", f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def first_difference(got, want):
    """The index of the first token where `got` and `want` differ (a length counts)."""
    return next(k for k, (a, b) in enumerate(zip(got + [-1], want + [-2])) if a != b)


def metric(port, name):
    """The value of the sample `name` (with its labels, as written) at 127.0.0.1:`port`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    return 0.0


def batonctl(bin_dir, socket_path, *args, timeout=15):
    """Runs `batonctl --json --socket SOCKET ARGS`: (exit status, the JSON of its last line or
    {}, its output)."""
    r = subprocess.run([os.path.join(bin_dir, "batonctl"), "--json", "--socket", socket_path,
                        *args], capture_output=True, text=True, timeout=timeout)
    lines = r.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except ValueError:
        answer = {}
    return r.returncode, answer, r.stdout + r.stderr


def serving_primary(status):
    for e in status.get("engines", []):
        if e.get("role") == "primary" and e.get("serving"):
            return e
    return None


def pair_ready(status, old_primary=None):
    """Whether `status` shows a serving primary other than `old_primary` and a standby."""
    p = serving_primary(status)
    standbys = [e for e in status.get("engines", []) if e.get("state") == "standby"]
    return (status.get("pair", {}).get("state") == "ready" and p is not None and
            bool(standbys) and p.get("id") != old_primary)


def engines_of(socket_path):
    """Pids of the processes whose environment carries BATON_SOCKET=`socket_path` (the engines
    a controller on that socket launched), found through /proc."""
    want = f"BATON_SOCKET={socket_path}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def stop_processes(procs, others, log, grace_s=20):
    """SIGCONT and SIGTERM to every Popen in `procs` (last first), waits up to `grace_s` for
    each, then SIGKILL to what is left of them and of `others`, a set of (pid, start time)
    (start_time): each is signalled only while that pid is still that process, never one that
    took a pid the stack saw before (logged: a process the stack's own stop did not end)."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a stopped process handles no SIGTERM
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            log(f"killed pid {proc.pid}, which did not stop on SIGTERM")
    for pid, start in sorted(others):
        if signal_same(pid, start, signal.SIGCONT) and signal_same(pid, start, signal.SIGKILL):
            log(f"killed pid {pid}, left after the stack stopped")
