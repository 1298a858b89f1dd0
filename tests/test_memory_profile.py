"""debug=memory charges resident memory to the phase that allocated it, so a run's peak is found by phase."""

from __future__ import annotations

import json
import subprocess
import sys

from omnimed.training.memory_profile import write_report

# Run in a fresh process: in a pytest(-xdist) worker that ran other tests first, the worker's own RSS moved by
# hundreds of MB during the test (twice seen lower than at its start, even after gc.collect()).
PHASES = """
import json, time
from omnimed.training.memory_profile import MemoryPhases

phases = MemoryPhases(interval=0.005)
phases.mark("small")
time.sleep(0.05)
phases.mark("big allocation")
block = bytearray(300 * 2**20)  # 300 MB, touched so it is resident
block[:: 4096] = b"x" * len(block[:: 4096])
time.sleep(0.05)
del block
phases.mark("after")
time.sleep(0.05)
print(json.dumps(phases.stop()))
"""


def test_memory_allocated_in_a_phase_is_charged_to_it(tmp_path):
    out = subprocess.run([sys.executable, "-c", PHASES], capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["peak_phase"] == "big allocation"
    assert report["phases"]["big allocation"]["rise_mb"] > 250
    assert report["phases"]["small"]["rise_mb"] < 50
    text = write_report(report, tmp_path / "memory.json")
    assert "peak RSS" in text and "big allocation" in text and (tmp_path / "memory.json").exists()
