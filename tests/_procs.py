"""Run a command whose processes all end with it, for tests that launch process trees.

`accelerate launch` starts its ranks through torch's elastic agent in a new session, so a
`subprocess.run(..., timeout=)` that kills the launcher on a timeout leaves the ranks running: they
keep the CPU, their ports and whatever file locks they hold, and the tests after them slow down or
wait. `run_tree` notes every descendant while the command runs and, when it ends (or times out),
kills whichever of them is still alive, then raises `subprocess.TimeoutExpired` as `subprocess.run`
does on a timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time

import psutil


def _descendants(root: psutil.Process, seen: dict[int, psutil.Process]) -> None:
    try:
        for child in root.children(recursive=True):
            seen.setdefault(child.pid, child)
    except psutil.Error:
        pass


def _kill(procs: list[psutil.Process]) -> None:
    for proc in procs:
        try:
            if proc.is_running():  # is_running compares creation times: a reused pid is not killed
                proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)


def kill_tree(pid: int) -> None:
    """Kill a running process and every descendant it has now."""
    try:
        root = psutil.Process(pid)
    except psutil.Error:
        return
    seen: dict[int, psutil.Process] = {}
    _descendants(root, seen)
    _kill([root, *seen.values()])


def run_tree(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)`, and no process
    it started outlives it."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, start_new_session=True, **kwargs)
        root, seen = psutil.Process(proc.pid), {}
        deadline, timed_out = time.monotonic() + timeout, False
        while proc.poll() is None:
            _descendants(root, seen)
            if time.monotonic() > deadline:
                timed_out = True
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                break
            time.sleep(0.5)
        _kill(list(seen.values()))
        proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if timed_out:
        raise subprocess.TimeoutExpired(cmd, timeout, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
