"""The example policies as the real-gateway rigs (tests/gateway, tests/evidence) compile
them: `policies/` with one figure changed, `slow-placement`'s threshold.

That breaker retries a call on the backup once it has taken 300 % of its predicted time:
15-35 ms predicted on the simulated fleet, so a budget of 45-105 ms, which a real Envoy and
KServe call keeps on a quiet machine and a loaded 2-core CI machine does not (seen at load 15:
ordinary calls broken and retried, their GPU's health lowered by the anomaly reports, the next
tests refused `health ruled out`). At 2000 % the budget is 0.3-0.7 s: ordinary calls are not
broken by the machine's load, and the tests that stall a call (`x-policyc-stall-ms: 5000`)
still see it broken at its budget, retried once and answered by the backup, seconds early.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from policy_text import REPO

SHIPPED = "when: elapsed >= 300 % of predicted"
FOR_RIGS = "when: elapsed >= 2000 % of predicted"


def rig_policies() -> Path:
    """A copy of `policies/` (in a new temporary folder) with `slow-placement` at 2000 %."""
    out = Path(tempfile.mkdtemp(prefix="policyc-rig-policies-")) / "policies"
    shutil.copytree(REPO / "policies", out)
    breakers = out / "breakers.contract"
    text = breakers.read_text()
    if text.count(SHIPPED) != 1:
        raise AssertionError(f"policies/breakers.contract no longer says `{SHIPPED}` once: update tests/rig_policies.py")
    breakers.write_text(text.replace(SHIPPED, FOR_RIGS))
    return out
