"""Builds that start with the test session and run in the background (tests/conftest.py): the DAG run of
tests/dag_run.py, the documented deploy of tests/deploy_run.py and the torchrun runs of tests/distributed_runs.py.
Their jobs leave a core idle much of the time (one job after another on a critical path, Snakemake planning, a
process starting), which the tests that run meanwhile use; the tests that read a build run last and wait for it.

Each build runs in a process of its own, started with the "spawn" method (a fresh interpreter): the test process
gets no extra thread, so a test that forks (a DataLoader worker, a launcher) never copies a lock another thread
holds, which would leave the forked child waiting forever."""

import contextlib
import multiprocessing
import os
import subprocess
import threading
from pathlib import Path
from typing import Callable

import psutil


def start(command: list[str] | str, **options) -> subprocess.Popen:
    """subprocess.Popen(command, **options) in a new process group (session): a build can kill a command with
    its jobs (tests/dag_run.py kills a run the way a node goes down)."""
    return subprocess.Popen(command, start_new_session=True, **options)


def run(command: list[str] | str, timeout: float, **options) -> subprocess.CompletedProcess:
    """subprocess.run(command, capture_output=True, text=True, timeout=timeout, **options), started by start()."""
    process = start(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **options)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_with_descendants(process.pid)
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def kill_with_descendants(pid: int) -> None:
    """SIGKILL to `pid` and every process below it, whatever process group or session each is in."""
    try:
        root = psutil.Process(pid)
        processes = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):  # it ended on its own meanwhile
            process.kill()
    psutil.wait_procs(processes, timeout=10)


def autogroup_of(pid: int | str) -> str | None:
    """The autogroup `pid` is in ("/autogroup-ID"), or None where it is in none: no /proc, autogroups off, or a
    process in a CPU cgroup of its own (a container's), for which Linux prints an empty line."""
    try:
        line = Path(f"/proc/{pid}/autogroup").read_text().split()
    except OSError:
        return None
    return line[0] if line else None


def yield_autogroups_to_the_tests(build_pid: int, niceness: int, stop: threading.Event) -> None:
    """Gives every new session below the build the build's niceness, until `stop` is set.

    Where Linux groups processes by session ("autogroup", on by default), a process's niceness only ranks it among
    its own session's processes, and each session gets an equal share of the CPU. The commands a build starts in a
    session of their own (start() below; torchrun starts each rank so) would then take a core from the tests
    whatever their niceness (a test ran at a third of its speed beside the torchrun ranks). A session's own
    niceness is set in /proc/PID/autogroup ("/autogroup-ID nice N"). Each group is read and set through one open
    file, which stays bound to its process, and known by its id, which Linux never reuses: a process that ends
    meanwhile, or a pid taken again, never renices another group. The build's own group, the tests' session, is
    left as it is. Without autogroups (or /proc), where the build is in none (a container's CPU cgroup), or where
    they cannot be set, there is nothing to do: niceness alone then ranks the builds below the tests."""
    own_group = autogroup_of(build_pid)
    if own_group is None:
        return
    niced_groups = {own_group}
    while not stop.wait(0.2):
        for process in psutil.Process(build_pid).children(recursive=True):
            try:
                with open(f"/proc/{process.pid}/autogroup", "r+b", buffering=0) as autogroup:
                    line = autogroup.read().split()
                    group = line[0].decode() if line else None
                    if group is not None and group not in niced_groups:
                        autogroup.seek(0)
                        autogroup.write(str(niceness).encode())
                        niced_groups.add(group)
            except (FileNotFoundError, ProcessLookupError, BlockingIOError):
                continue  # ended meanwhile; or EAGAIN: Linux takes one change per 0.1 s, the next round retries
            except OSError:
                return  # not ours to set (EPERM, EACCES): the builds run at their niceness within sessions only


def _build_and_send(build: Callable, niceness: int, connection) -> None:
    """The build process: `build(run=run, start=start)`, and what it returned or raised sent back."""
    os.nice(niceness)  # ranks it within the tests' session; what it starts inherits it
    stop_nicing = threading.Event()
    if niceness:  # a new session's autogroup starts at 0 already
        threading.Thread(target=yield_autogroups_to_the_tests, args=(os.getpid(), niceness, stop_nicing),
                         daemon=True).start()
    try:
        outcome = build(run=run, start=start)
    except BaseException as error:  # raised again by result(), in the test that reads the build
        outcome = error
    stop_nicing.set()
    connection.send(outcome)
    connection.close()


class InBackground:
    """`build(run=..., start=...)` in a spawned process at `niceness` (it and every command it starts): a build
    with a long chain of jobs that must run one after another runs beside the tests at their priority, the others
    below them, filling whatever the tests leave idle (tests/conftest.py gives each build its own). `build` and
    what it returns must pickle (module-level functions, dataclasses of paths and completed processes)."""

    def __init__(self, build: Callable, name: str, niceness: int):
        context = multiprocessing.get_context("spawn")
        self._receiving, sending = context.Pipe(duplex=False)
        self._process = context.Process(target=_build_and_send, args=(build, niceness, sending), name=name,
                                        daemon=True)
        self._process.start()
        sending.close()  # the parent keeps only its receiving end: a build that dies closes the pipe
        self._outcome = None
        self._received = False

    def result(self):
        """What the build returned, once it has (what it raised is raised here)."""
        if not self._received:
            try:
                self._outcome = self._receiving.recv()
            except EOFError:
                self._process.join()
                self._outcome = RuntimeError(f"the background build {self._process.name} died without a result "
                                             f"(exit code {self._process.exitcode})")
            self._received = True
            self._process.join()
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return self._outcome

    def stop(self) -> None:
        """Kill the build and every command it started (a session that ends before the build does)."""
        if self._process.is_alive():
            kill_with_descendants(self._process.pid)
        self._process.join()
