"""pipeline/machine.py: the peak resident memory a benchmark reports for a process."""

import os

import numpy as np
import pytest

from pipeline.machine import high_water_mark_mb


@pytest.mark.skipif(not os.path.isfile("/proc/self/status"), reason="the kernel's VmHWM is read from /proc (Linux)")
def test_the_high_water_mark_grows_with_memory_touched_and_names_no_process_that_is_gone():
    before = high_water_mark_mb()
    block = np.ones(64 * 2**20 // 8)  # 64 MB, every page written
    after = high_water_mark_mb(os.getpid())
    assert before is not None and after >= before + 60
    del block
    # The mark does not fall with the memory freed (the kernel syncs its per-thread counters lazily: a few kB).
    assert high_water_mark_mb() > after - 1
    assert high_water_mark_mb(2**22 + 12345) is None  # above pid_max: no such process
