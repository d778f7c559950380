"""A janitor for a Python perf program's run: what the C++ drivers get from RunGuard
(base/process/run_guard.h), for a program killed with kill -9.

start() tags the environment (BATON_RUN_GUARD gets the run's token, which every process the
run starts inherits: the controller passes it on to its engines and baton-keeper) and forks
the janitor (no child of the run's: the run's own stop kills its children), which holds the read end of a pipe only this process writes. When the pipe
closes without the word of a normal end (done()), the run was killed: the janitor asks the
run's controllers to stop (SIGTERM: a clean stop stops their engines and removes their
cgroups), gives them 5 s, kills whatever still carries the token, and removes the folders
the run registered with remove_if_interrupted(). A run that ends normally stops its own
processes and removes its own folders; the janitor then leaves.

Call start() before any thread starts. Nothing here starts a process on import.
"""
import os
import secrets
import shutil
import signal
import time

VARIABLE = "BATON_RUN_GUARD"
GENTLE_S = 5
SWEEP_S = 20


def _tagged(token):
    """The pids (not this process) whose environment carries `token` in BATON_RUN_GUARD."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(VARIABLE.encode() + b"=") and \
                    token.encode() in item.split(b"=", 1)[1].split(b":"):
                out.append(int(name))
    return out


def _comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _present(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _sweep(token):
    controllers = [p for p in _tagged(token) if _comm(p) == "baton-controlle"]  # 15 bytes
    for pid in controllers:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + GENTLE_S
    while any(_present(p) for p in controllers) and time.monotonic() < deadline:
        time.sleep(0.02)
    deadline = time.monotonic() + SWEEP_S
    empty = 0
    while empty < 3 and time.monotonic() < deadline:
        left = _tagged(token)
        empty = 0 if left else empty + 1
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)


def _janitor(read_fd, token):
    os.setsid()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    data = b""
    while True:
        chunk = os.read(read_fd, 4096)
        if not chunk:
            break
        data += chunk
    lines = data.split(b"\n")
    if b"E" in lines:
        os._exit(0)  # a normal end: the run stopped and removed its own
    _sweep(token)
    for line in lines:
        if line.startswith(b"R"):
            shutil.rmtree(line[1:].decode(), ignore_errors=True)
    os._exit(0)


class Janitor:
    def __init__(self, write_fd):
        self._fd = write_fd

    def remove_if_interrupted(self, path):
        """`path` goes if the run is killed (its own stop removes it otherwise)."""
        if self._fd is not None:
            os.write(self._fd, b"R" + path.encode() + b"\n")

    def done(self):
        """The run stopped what it started: the janitor leaves everything alone."""
        if self._fd is not None:
            os.write(self._fd, b"E\n")
            os.close(self._fd)
            self._fd = None


def start(name):
    token = f"{name}.{os.getpid()}.{secrets.token_hex(4)}"
    outer = os.environ.get(VARIABLE, "")
    os.environ[VARIABLE] = f"{outer}:{token}" if outer else token
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # forks the janitor and leaves: no child of the run's, which it stops
        os.close(write_fd)
        try:
            if os.fork() == 0:
                _janitor(read_fd, token)
        finally:
            os._exit(0)
    os.close(read_fd)
    os.waitpid(pid, 0)
    return Janitor(write_fd)
