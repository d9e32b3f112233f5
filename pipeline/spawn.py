"""Work in a fresh spawned process, for libraries whose threads must stay out of the calling process."""

from __future__ import annotations

import concurrent.futures
import multiprocessing

from pipeline.startup import libraries_loaded, pause_collection_while_loading, prepare_process


def _prepare_spawned_process() -> None:
    prepare_process()
    pause_collection_while_loading()  # until the function's module is loaded (_call_loaded)


def _call_loaded(function, *args):
    """function(*args), its module loaded as the call was unpickled: collection resumes first."""
    libraries_loaded()
    return function(*args)


def in_spawned_process(function, *args):
    """function(*args) in a fresh spawned process (function and args must pickle), with the library settings of
    every process of the pipeline (pipeline/startup.py: the process runs no entry point of ours). The stages run
    OpenVINO and NNCF this way: with OpenVINO's CPU plugin threads in a process, a process forked from it later (a
    DataLoader worker, in the same test session) crashed it (docs/findings.md)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context, initializer=_prepare_spawned_process) as pool:
        return pool.submit(_call_loaded, function, *args).result()
