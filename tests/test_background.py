"""tests/background.py: a background build gives its niceness to the sessions it starts, and leaves its own session
(the tests') as it is."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.skipif(not Path("/proc/self/autogroup").is_file(), reason="no Linux autogroups on this machine")
def test_the_sessions_a_build_starts_get_its_niceness_and_its_own_session_keeps_its_own():
    own = Path("/proc/self/autogroup").read_text().split()[-1]  # "/autogroup-N nice K": K
    completed = subprocess.run([sys.executable, "-c", BUILD], capture_output=True, text=True, cwd=PROJECT_ROOT,
                               timeout=60, check=True)
    assert json.loads(completed.stdout) == {"started": "7", "own": own}
