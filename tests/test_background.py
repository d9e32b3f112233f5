"""tests/background.py: a background build gives its niceness to the sessions it starts, and leaves its own session
(the tests') as it is."""

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.background import autogroup_of, yield_autogroups_to_the_tests
from tests.conftest import PROJECT_ROOT

# A stand-in build: it watches its own descendants as InBackground's build process does, starts a command in a
# session of its own, and prints that session's autogroup line and its own once the watcher has had its time.
BUILD = """
import json, os, subprocess, sys, threading, time
from pathlib import Path
from tests.background import yield_autogroups_to_the_tests
stop = threading.Event()
threading.Thread(target=yield_autogroups_to_the_tests, args=(os.getpid(), 7, stop), daemon=True).start()
command = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
line = Path(f"/proc/{command.pid}/autogroup")
deadline = time.monotonic() + 10
while time.monotonic() < deadline and not line.read_text().strip().endswith("nice 7"):
    time.sleep(0.05)
own = Path("/proc/self/autogroup").read_text().split()[-1]
print(json.dumps({"started": line.read_text().split()[-1], "own": own}))
stop.set()
command.kill()
"""


def test_a_process_in_no_autogroup_has_none_and_the_watcher_leaves_it_at_once():
    no_such_process = 2**31  # above Linux's largest pid: /proc has no entry, as for a process in no autogroup
    assert autogroup_of(no_such_process) is None
    # The watcher of a build in no autogroup (autogroups off, a container's CPU cgroup) has nothing to do: it
    # returns before its first round, though `stop` is never set.
    watcher = threading.Thread(target=yield_autogroups_to_the_tests, args=(no_such_process, 7, threading.Event()))
    watcher.start()
    watcher.join(timeout=5)
    assert not watcher.is_alive()


@pytest.mark.skipif(autogroup_of("self") is None, reason="this process is in no Linux autogroup (autogroups off, "
                                                         "or a CPU cgroup of its own)")
def test_the_sessions_a_build_starts_get_its_niceness_and_its_own_session_keeps_its_own():
    own = Path("/proc/self/autogroup").read_text().split()[-1]  # "/autogroup-N nice K": K
    completed = subprocess.run([sys.executable, "-c", BUILD], capture_output=True, text=True, cwd=PROJECT_ROOT,
                               timeout=60, check=True)
    assert json.loads(completed.stdout) == {"started": "7", "own": own}
