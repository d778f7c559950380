"""An engine process for the Python tests: started with --port-file, waited for until it
listens, and killed by the caller (proc.kill(); proc.wait()) on every exit path."""
import os
import subprocess
import time


def start_engine(argv, port_file, limit_s=300):
    """Starts `argv` + ["--port-file", port_file]; returns (process, port) once the port is
    written. RuntimeError (the process killed and reaped) when it exits or never listens."""
    if os.path.exists(port_file):
        os.remove(port_file)
    proc = subprocess.Popen(argv + ["--port-file", port_file], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        text = ""
        if os.path.exists(port_file):
            with open(port_file) as f:
                text = f.read().strip()
        if text:
            return proc, int(text)
        if proc.poll() is not None:
            raise RuntimeError(f"{argv[0]} exited with {proc.returncode}")
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"{argv[0]} never wrote its port")
