"""Commands the end-to-end builds run (tests/dag_run.py, tests/deploy_run.py): each in a process group of its own, so
that a build can kill a command with its jobs (tests/dag_run.py kills a run the way a node goes down), and a command
that runs past its time is killed with everything below it."""

import contextlib
import subprocess

import psutil


def start(command: list[str] | str, **options) -> subprocess.Popen:
    """subprocess.Popen(command, **options) in a new process group (session): a build can kill a command with
    its jobs (tests/dag_run.py kills a run the way a node goes down)."""
    return subprocess.Popen(command, start_new_session=True, **options)


def run(command: list[str] | str, timeout: float, **options) -> subprocess.CompletedProcess:
    """subprocess.run(command, capture_output=True, text=True, timeout=timeout, **options), started by start(); the
    command and everything below it are killed when it runs past `timeout` or the tests are interrupted."""
    process = start(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **options)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:  # past its time, or the run interrupted: its own session would outlive the tests
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
