"""engine.omp_wait_policy: ``auto`` picks sleeping OpenMP waits when another process keeps a core busy as
the run starts (spinning threads sharing a core with it made steps tens of times slower), and the
workers' environment carries the choice."""

import subprocess
import sys
import time

from armor_core.engine import busy_cores, wait_policy


def test_explicit_policies_are_kept():
    assert wait_policy("active") == "active" and wait_policy("passive") == "passive"


def test_auto_sees_a_busy_core_and_chooses_passive():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # let it start spinning
        assert busy_cores() >= 0.8
        assert wait_policy("auto") == "passive"
    finally:
        spinner.kill()
        spinner.wait()
