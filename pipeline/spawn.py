"""Work in a fresh spawned process, for libraries whose threads must stay out of the calling process."""

from __future__ import annotations

import concurrent.futures
import importlib
import multiprocessing

from pipeline.startup import libraries_loaded, pause_collection_while_loading, prepare_process


def _prepare_spawned_process() -> None:
    prepare_process()
    pause_collection_while_loading()  # until the function and its libraries are loaded (_call_loaded)


def _call_loaded(libraries: tuple[str, ...], function, *args):
    """function(*args), its module loaded as the call was unpickled and `libraries` imported here, before
    collection resumes."""
    for library in libraries:
        importlib.import_module(library)
    libraries_loaded()
    return function(*args)


def in_spawned_process(function, *args, libraries: tuple[str, ...] = ()):
    """function(*args) in a fresh spawned process (function and args must pickle), with the library settings of
    every process of the pipeline (pipeline/startup.py: the process runs no entry point of ours); `libraries`: the
    modules the function imports as it runs, loaded first with the process's other libraries (pipeline/startup.py,
    3). The stages run OpenVINO and NNCF this way: with OpenVINO's CPU plugin threads in a process, a process forked
    from it later (a DataLoader worker, in the same test session) crashed it (docs/findings.md)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context, initializer=_prepare_spawned_process) as pool:
        return pool.submit(_call_loaded, libraries, function, *args).result()
