"""`policyc audit report --format html` rendered in a real headless Chromium (Debian's
`chromium`, installed by scripts/setup.sh): the page loads with no console message (a
control page proves such messages are seen), fetches nothing (its Content-Security-Policy
forbids every external resource, and a violation would be a console error), and its DOM
carries the verdict, both tables and the charts. A screenshot is taken;
`POLICYC_UPDATE_DOCS=1` copies it to docs/audit-report.png (the README shows it)."""

from __future__ import annotations

import math
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from policy_text import REPO

from policyc.audit.accounting import measured
from policyc.audit.log import AuditLog
from policyc.audit.records import Figure, Resources, Source
from policyc.cli.main import main

sys.path.insert(0, str(REPO / "tests" / "audit"))  # the audit tests' record builders
from audit_helpers import decision  # noqa: E402

T0 = 1777593600.0  # 2026-05-01T00:00:00Z
REASONS = ("no live instance satisfies the applicable rules: `compliance.finance-hardening`",
           "placement: every candidate GPU is behind an RDMA port over its watermark",
           "feasibility: no declared contract can meet `X-SLO-Latency: 20ms`",
           "header `X-Data-Region`: `mars-1` is not one of us-west, us-east, eu-west, eu-central")
MODELS = ("fraud-scorer", "recommender", "chatbot", "clinical-notes")
TENANTS = ("acme-bank", "st-marys", "anonymous", "globex")


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI", "").lower() == "true" or os.geteuid() == 0:
            pytest.fail("chromium is not installed: scripts/setup.sh installs Debian's `chromium` as root")
        pytest.skip("chromium is not installed (scripts/setup.sh installs it when run as root)")
    return found


def _browser(chromium: str, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
           "--enable-logging=stderr", "--v=0", "--hide-scrollbars", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _console(stderr: str) -> list[str]:
    """The page's console messages in Chromium's log."""
    return [line for line in stderr.splitlines() if re.search(r"CONSOLE|console", line)]


def _log(path: Path, n: int = 480) -> None:
    with AuditLog.open(path, checkpoint_every=60, durability="normal") as log:
        receipts = []
        for i in range(n):
            t = T0 + i * 15
            load = 1 + math.sin(i / 40)  # a daily-looking wave
            rejected = i % 7 == 0 or (i % 11 == 0 and load > 1.5)
            gpu = measured(0.004 * load + 0.0005 * (i % 5), "nvml") if i % 3 else \
                Figure(value=0.0045 * load, source=Source.ESTIMATED, method="contract_flops/peak", low=0.003, high=0.006)
            rec = decision(i, t=t, model=MODELS[i % 4], tenant=TENANTS[(i // 3) % 4],
                           outcome="rejected" if rejected else "admitted",
                           reason=REASONS[(i // 7) % 4] if rejected else None,
                           resources=Resources(gpu_seconds=None if rejected else gpu,
                                               memory_bytes=measured(2.4e9 * load, "nvml"),
                                               network_bytes=measured(4096.0 + i, "kernel_flow_counters")))
            receipts.append(log.submit_decision(rec))
        for r in receipts:
            r.wait()


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_html_report_renders_in_headless_chromium(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chromium = _chromium()
    db, page = tmp_path / "audit.db", tmp_path / "report.html"
    _log(db)
    assert main(["audit", "report", "--log", str(db), "--format", "html", "-o", str(page)]) == 0
    capsys.readouterr()
    text = page.read_text()
    # self-contained: nothing to fetch, no script
    for forbidden in ("<script", "<link", "<img", "<iframe", "url(", "@import", "src=", "href="):
        assert forbidden not in text, forbidden
    assert "default-src 'none'" in text
    for expect in ("Chain intact: 480 entries", "Per model", "Per tenant", "Rejections by reason", "Decisions per model",
                   "Decisions per tenant", "GPU seconds over time: measured vs estimated", "fraud-scorer", "st-marys"):
        assert expect in text, expect

    # the control: a console error on a page is seen in the log
    control = tmp_path / "control.html"
    control.write_text("<!DOCTYPE html><html><body><script>console.error('policyc-control-message')</script></body></html>")
    seen = _browser(chromium, tmp_path / "profile-control", "--dump-dom", control.as_uri())
    assert any("policyc-control-message" in line for line in _console(seen.stderr)), seen.stderr[-2000:]

    dom = _browser(chromium, tmp_path / "profile-dom", "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert _console(dom.stderr) == [], _console(dom.stderr)
    assert dom.stdout.count("<svg") >= 5 and dom.stdout.count("<table>") == 2 and "Chain intact" in dom.stdout

    shot = tmp_path / "report.png"
    run = _browser(chromium, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1200,1560", page.as_uri())
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    assert _console(run.stderr) == [], _console(run.stderr)
    data = shot.read_bytes()
    assert _png_size(data) == (1200, 1560) and len(data) > 50_000  # a drawn page, not a blank one
    if os.environ.get("POLICYC_UPDATE_DOCS") == "1":
        shutil.copy(shot, REPO / "docs" / "audit-report.png")


def test_html_report_names_a_tampered_chain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import sqlite3

    db, page = tmp_path / "audit.db", tmp_path / "report.html"
    _log(db, 30)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE entries SET body = replace(body, 'admitted', 'rejected') WHERE seq = 12")
    assert main(["audit", "report", "--log", str(db), "--format", "html", "-o", str(page)]) == 0
    capsys.readouterr()
    assert 'class="verdict bad"' in page.read_text() and "TAMPERED: first bad entry 12" in page.read_text()
