"""`policyc audit report --format html` rendered in a real headless Chromium (Debian's
`chromium`, installed by scripts/setup.sh): the page loads with no console message (a
control page proves such messages are seen), fetches nothing (its Content-Security-Policy
forbids every external resource, and a violation would be a console error), and its DOM
names the bundle hash, policyc's version, the anchor and the generation, carries an amber
verdict when no public key is given, the per-model, tenant and region tables, rejections
grouped by rule with their source lines, and a time axis with several labels. A screenshot
is taken; `POLICYC_UPDATE_DOCS=1` copies it to docs/audit-report.png (the README shows it).
With the keys, the signed bundle and the sealed head the verdict is green; `--sign` writes a
detached signature that `policyc audit verify-report` checks and refuses once the file changes."""

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

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policyc.audit.accounting import measured
from policyc.audit.log import AuditLog
from policyc.audit.provenance import policyc_version
from policyc.audit.records import Figure, MatchedRule, Placement, Resources, Source
from policyc.cli.main import main
from policyc.compiler import bundle_io
from policyc.compiler.bundle import SourceRef
from policyc.compiler.pipeline import compile_paths

sys.path.insert(0, str(REPO / "tests" / "audit"))  # the audit tests' record builders
from audit_helpers import decision  # noqa: E402

T0 = 1777593600.0  # 2026-05-01T00:00:00Z
REASONS = ("no live instance satisfies the applicable rules: `compliance.finance-hardening`",
           "placement: every candidate GPU is behind an RDMA port over its watermark",
           "feasibility: no declared contract can meet `X-SLO-Latency: 20ms`",
           "header `X-Data-Region`: `mars-1` is not one of us-west, us-east, eu-west, eu-central")
MODELS = ("fraud-scorer", "recommender", "chatbot", "clinical-notes")
TENANTS = ("acme-bank", "st-marys", "anonymous", "globex")
REGIONS = ("us-west", "eu-central", "us-east")
RULES = (MatchedRule(id="compliance.finance-hardening", origin=SourceRef(file="policies/compliance.contract", line=14, col=3)),
         MatchedRule(id="latency.slo-floor", origin=SourceRef(file="policies/latency.contract", line=7, col=3)))
LOG_KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(3, 35)))
BUNDLE_KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(5, 37)))


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


def _pem(key: Ed25519PrivateKey, path: Path, private: bool = False) -> Path:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
                     if private else key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


def _bundle(d: Path) -> tuple[Path, str]:
    """The repository's policies compiled and signed: a real bundle file and its hash."""
    bundle = bundle_io.sign(compile_paths([REPO / "policies"]).bundle, BUNDLE_KEY)
    bundle_io.write(bundle, d / "bundle.json")
    return d / "bundle.json", bundle.content_hash


def _log(path: Path, n: int = 480, bundle_hash: str = "sha256:" + "ab" * 32, key: Ed25519PrivateKey | None = None) -> None:
    with AuditLog.open(path, signing_key=key, checkpoint_every=60, durability="normal") as log:
        receipts = []
        for i in range(n):
            t = T0 + i * 15
            load = 1 + math.sin(i / 40)  # a daily-looking wave
            rejected = i % 7 == 0 or (i % 11 == 0 and load > 1.5)
            gpu = measured(0.004 * load + 0.0005 * (i % 5), "nvml") if i % 3 else \
                Figure(value=0.0045 * load, source=Source.ESTIMATED, method="contract_flops/peak", low=0.003, high=0.006)
            rec = decision(i, t=t, model=MODELS[i % 4], tenant=TENANTS[(i // 3) % 4], bundle_hash=bundle_hash,
                           outcome="rejected" if rejected else "admitted",
                           reason=REASONS[(i // 7) % 4] if rejected else None,
                           matched_rules=RULES[: 1 + i % 2],
                           placement=Placement(instance=f"inst-{i % 5}", host="h1", gpu="gpu0", region=REGIONS[i % 3], share=0.25),
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
    bundle, bundle_hash = _bundle(tmp_path)
    _log(db, bundle_hash=bundle_hash, key=LOG_KEY)
    # no public key: the chain checks out, but the verdict cannot be green
    assert main(["audit", "report", "--log", str(db), "--format", "html", "-o", str(page), "--bundle", str(bundle),
                 "--sources", str(REPO / "policies"), "--auditor", "auditor@example"]) == 0
    capsys.readouterr()
    text = page.read_text()
    # self-contained: nothing to fetch, no script
    for forbidden in ("<script", "<link", "<img", "<iframe", "url(", "@import", "src=", "href="):
        assert forbidden not in text, forbidden
    assert "default-src 'none'" in text
    for expect in ("Chain intact: 480 entries", "Per model", "Per tenant", "Per region", "Rejections by rule", "Decisions per model",
                   "Decisions per tenant", "Decisions per region", "GPU seconds over time: measured vs estimated", "fraud-scorer", "st-marys",
                   "eu-central", "policies/compliance.contract:14", "compliance.finance-hardening", "auditor@example",
                   "checkpoint signatures were not checked", "time (UTC)"):
        assert expect in text, expect

    # the control: a console error on a page is seen in the log
    control = tmp_path / "control.html"
    control.write_text("<!DOCTYPE html><html><body><script>console.error('policyc-control-message')</script></body></html>")
    seen = _browser(chromium, tmp_path / "profile-control", "--dump-dom", control.as_uri())
    assert any("policyc-control-message" in line for line in _console(seen.stderr)), seen.stderr[-2000:]

    dom = _browser(chromium, tmp_path / "profile-dom", "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert _console(dom.stderr) == [], _console(dom.stderr)
    shown = dom.stdout
    assert shown.count("<svg") >= 6 and shown.count('<table class="figures">') == 3 and "Chain intact" in shown
    assert 'data-verdict="amber"' in shown and "Verdict: AMBER" in shown
    assert bundle_hash in shown and "signature: not checked" in shown  # a signed bundle, no --bundle-key
    assert f"policyc version</th><td>{policyc_version()}" in shown
    anchor = re.search(r"anchor</th><td><span class=\"mono\">(\d+):([0-9a-f]{64})", shown)
    assert anchor is not None and int(anchor.group(1)) == 480  # the close record
    assert "2026-05-01 00:00" in shown and len(re.findall(r'class="tick"', shown)) >= 10  # two charts, six labelled ticks each

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
    assert 'data-verdict="red"' in page.read_text() and "first bad entry 12" in page.read_text()


def test_html_report_green_only_when_everything_verified_and_signed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, page = tmp_path / "audit.db", tmp_path / "report.html"
    bundle, bundle_hash = _bundle(tmp_path)
    _log(db, 60, bundle_hash=bundle_hash, key=LOG_KEY)
    log_pub, bundle_pub = _pem(LOG_KEY, tmp_path / "log.pub"), _pem(BUNDLE_KEY, tmp_path / "bundle.pub")
    signer = _pem(Ed25519PrivateKey.generate(), tmp_path / "auditor.key", private=True)
    from policyc.audit.checkpoints import load_private_key

    auditor_pub = _pem(load_private_key(signer), tmp_path / "auditor.pub")
    assert main(["audit", "report", "--log", str(db), "--format", "html", "-o", str(page), "--public-key", str(log_pub),
                 "--bundle", str(bundle), "--bundle-key", str(bundle_pub), "--sign", str(signer)]) == 0
    assert "signed" in capsys.readouterr().err
    text = page.read_text()
    assert 'data-verdict="green"' in text and "Everything was verified." in text and "signature: verified" in text
    assert main(["audit", "verify-report", str(page), "--public-key", str(auditor_pub)]) == 0
    assert capsys.readouterr().out.startswith("ok: ")
    assert main(["audit", "verify-report", str(page), "--public-key", str(log_pub)]) == 1  # another key
    page.write_text(text.replace("GREEN", "GREEN!"))
    assert main(["audit", "verify-report", str(page), "--public-key", str(auditor_pub)]) == 1
    assert "changed after it was signed" in capsys.readouterr().out
    # the bundle's signature checked with the wrong key: red
    assert main(["audit", "report", "--log", str(db), "--format", "html", "-o", str(page), "--public-key", str(log_pub),
                 "--bundle", str(bundle), "--bundle-key", str(log_pub)]) == 0
    assert 'data-verdict="red"' in page.read_text()
