"""`policyc demo --workdir` that cannot be made is one line, not a traceback. (A relative
`--workdir out/`, the example in its own --help, is what tests/demo/test_demo.py runs the
whole demo with: one run of the demo serves both.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path



def test_demo_workdir_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = subprocess.run([sys.executable, "-m", "policyc.cli.main", "demo", "--workdir", "file/out"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("policyc demo: error: --workdir file/out:"), r.stderr
