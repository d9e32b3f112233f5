"""pipeline/outputs/machine.py: the peak resident memory a benchmark reports for a process."""

import json
import os
import subprocess
import sys

import pytest

from pipeline.outputs.machine import high_water_mark_mib
from tests.paths import PROJECT_ROOT

# A fresh process, so that no earlier peak hides the growth: its mark before and after 64 MiB are written.
TOUCH_64_MIB = """
import json, os
import numpy as np
from pipeline.outputs.machine import high_water_mark_mib
before = high_water_mark_mib()
block = np.ones(64 * 2**20 // 8)
print(json.dumps([before, high_water_mark_mib(os.getpid())]))
"""


@pytest.mark.skipif(not os.path.isfile("/proc/self/status"), reason="the kernel's VmHWM is read from /proc (Linux)")
def test_the_high_water_mark_grows_with_memory_touched_and_names_no_process_that_is_gone():
    completed = subprocess.run([sys.executable, "-c", TOUCH_64_MIB], capture_output=True, text=True, check=True,
                               cwd=PROJECT_ROOT)
    before, after = json.loads(completed.stdout)
    assert before is not None and after >= before + 60
    assert high_water_mark_mib() > 0
    assert high_water_mark_mib(2**22 + 12345) is None  # above pid_max: no such process
