"""Builds that start with the test session and run in the background (tests/conftest.py): the DAG run of
tests/dag_run.py and the documented deploy of tests/deploy_run.py. Their jobs leave a core idle much of the time
(one job after another on a critical path, Snakemake planning), which the tests that run meanwhile use; the tests
that read a build run last and wait for it."""

import os
import signal
import subprocess
import threading
from typing import Callable


class InBackground:
    """`build(run=self.run, start=self.start)` in a thread of its own. Every command it runs goes through `run` or
    `start`, in a process group of its own, so that stop() can kill it with its jobs (a session that ends first)."""

    def __init__(self, build: Callable, name: str):
        self._processes: list[subprocess.Popen] = []
        self._stopping = threading.Event()
        self._outcome = None
        self._thread = threading.Thread(target=self._build, args=(build,), name=name, daemon=True)
        self._thread.start()

    def _build(self, build: Callable) -> None:
        try:
            self._outcome = build(run=self.run, start=self.start)
        except BaseException as error:  # raised again by result(), in the test that reads the build
            self._outcome = error

    def start(self, command: list[str] | str, **options) -> subprocess.Popen:
        """subprocess.Popen(command, **options) in a new process group (session)."""
        if self._stopping.is_set():
            raise RuntimeError("the test session ended before this build")
        process = subprocess.Popen(command, start_new_session=True, **options)
        self._processes.append(process)
        return process

    def run(self, command: list[str] | str, timeout: float, **options) -> subprocess.CompletedProcess:
        """subprocess.run(command, capture_output=True, text=True, timeout=timeout, **options), started by start()."""
        process = self.start(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **options)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
        return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)

    def result(self):
        """What the build returned, once it has (what it raised is raised here)."""
        self._thread.join()
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return self._outcome

    def stop(self) -> None:
        self._stopping.set()
        while self._thread.is_alive():  # again while it runs: a command may have started just as it was told
            for process in self._processes:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
            self._thread.join(timeout=1)
