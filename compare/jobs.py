"""Running the stages: a list of jobs, each after the jobs it names, in this process (one worker)
or as parallel subprocesses with their output in log files, and progress lines on stderr."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from compare.config import ROOT, CompareError


def log(msg: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_logged(cmd: list[str], log_path: Path, name: str, threads: int | None = None) -> None:
    """Run `cmd` with its output in `log_path`; raise with the log's tail when it fails. `threads`:
    the subprocess's OMP_NUM_THREADS (None: this process's, 1 when unset)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    omp = str(threads) if threads is not None else os.environ.get("OMP_NUM_THREADS", "1")
    env = dict(os.environ, OMP_NUM_THREADS=omp, TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    log(f"{name}: started (log: {log_path})")
    with log_path.open("ab") as fh:
        fh.write(f"\n$ {shlex.join(cmd)}\n".encode())
        fh.flush()
        # the same working directory as this process, so that relative paths mean the same there
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        code = proc.wait()
    if code:
        raise CompareError(f"{name} failed with exit code {code}; the end of {log_path}:\n{_tail(log_path, 3000)}")
    log(f"{name}: done")


def _tail(path: Path, chars: int) -> str:
    try:
        data = path.read_bytes()[-chars:].decode(errors="replace")
    except OSError:
        return ""
    return data.replace("\r", "\n")


def _last_line(path: Path) -> str:
    lines = [x.strip() for x in _tail(path, 2000).splitlines() if x.strip()]
    return lines[-1][-160:] if lines else ""


def _heartbeat_line(job: Job, path: Path) -> str:
    """The job's own progress line where it has one, else its log's last line; a progress reader
    that fails (a metrics line half written, say) falls back to the log rather than stopping the beat."""
    if job.progress is not None:
        try:
            line = job.progress()
        except Exception:  # noqa: BLE001 - progress is a courtesy; the job's own log holds the truth
            line = None
        if line:
            return line
    return _last_line(path)


@dataclass
class Job:
    name: str
    inline: Callable[[], None]
    """The work, in this process."""
    command: list[str] | None
    """The same work as a subprocess (None: always in this process)."""
    after: list[str] = field(default_factory=list)
    finish: Callable[[], None] | None = None
    """Run in this process after the work succeeded (e.g. writing an artefact's marker)."""
    threads: int | None = None
    """OMP_NUM_THREADS of the subprocess (None: inherited, 1 when unset). Jobs side by side on a
    small machine want 1 each: two 2-thread processes on 2 cores run many times slower."""
    progress: Callable[[], str | None] | None = None
    """What the heartbeat says of the running job (e.g. a PPO run's update and reward, read from its
    metrics); None, or when it returns None: the last line of the job's log."""


def run_jobs(jobs: list[Job], workers: int, log_dir: Path, heartbeat: float = 60.0) -> None:
    """Run `jobs` (each after the jobs it names) on `workers` slots; report progress to stderr."""
    if workers <= 1:
        for job in jobs:
            job.inline()
            if job.finish:
                job.finish()
        return
    events = {job.name: threading.Event() for job in jobs}
    failed: list[BaseException] = []
    running: dict[str, Job] = {}
    lock = threading.Lock()

    def work(job: Job) -> None:
        for dep in job.after:
            if dep in events:
                events[dep].wait()
        try:
            if failed:
                return
            if job.command is None:
                job.inline()
            else:
                path = log_dir / f"{job.name}.log"
                with lock:
                    running[job.name] = job
                try:
                    run_logged(job.command, path, job.name, threads=job.threads)
                finally:
                    with lock:
                        running.pop(job.name, None)
            if job.finish:
                job.finish()
        except BaseException as e:  # noqa: BLE001 - reported after every job stopped
            failed.append(e)
        finally:
            events[job.name].set()

    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(heartbeat):
            with lock:
                items = list(running.items())
            for name, job in items:
                log(f"{name}: {_heartbeat_line(job, log_dir / f'{name}.log')}")

    ticker = threading.Thread(target=beat, daemon=True)
    ticker.start()
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(work, jobs))
    finally:
        stop.set()
    if failed:
        raise failed[0]
