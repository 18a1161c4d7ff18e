"""An agent's signal report signed with its report key (`cluster/signed_reports.py`) and
taken by the replica's book only when it verifies: a byte changed, another key, a missing
or misplaced signature are each refused, naming why; an old report is refused as replayed."""

from __future__ import annotations

import json
import time

from policyc.cluster.measured_hosts import HostSignalBook
from policyc.cluster.signed_reports import ReportKey, public_key, verify


def _report(t: float) -> bytes:
    return json.dumps({"time": t, "agent": {"period_s": 0.2}, "interfaces": {"eth0": {"up": 1.0, "tx_Bps": 10.0}},
                       "host": "host-0002"}, separators=(",", ":")).encode()


def test_a_signed_report_verifies_and_any_change_does_not() -> None:
    key, other = ReportKey(), ReportKey()
    pub = public_key(key.public_hex)
    signed = key.sign(_report(100.0))
    assert json.loads(signed)["time"] == 100.0 and verify(signed, pub) == ""
    tampered = signed.replace(b'"tx_Bps":10.0', b'"tx_Bps":90.0')
    assert "does not verify" in verify(tampered, pub)
    assert "does not verify" in verify(other.sign(_report(100.0)), pub)
    assert "unsigned" in verify(_report(100.0), pub)
    assert "not its last field" in verify(signed + b" ", pub)
    for bad in ("zz", "00" * 31):
        try:
            public_key(bad)
        except ValueError as e:
            assert "report key" in str(e)
        else:
            raise AssertionError(f"{bad!r} taken as a key")


def test_the_book_takes_only_verified_reports_and_refuses_a_replayed_one() -> None:
    key = ReportKey()
    pub = public_key(key.public_hex)
    book = HostSignalBook()
    now = time.time()
    book.on_report("host-0002", key.sign(_report(now)), lambda raw: verify(raw, pub))
    assert book.reports["host-0002"].time == now and book.verified["host-0002"] == 1
    book.on_report("host-0002", ReportKey().sign(_report(now + 1)), lambda raw: verify(raw, pub))
    assert book.reports["host-0002"].time == now and "does not verify" in book.last_refusal["host-0002"]
    book.on_report("host-0002", key.sign(_report(now - 5)), lambda raw: verify(raw, pub))
    assert book.reports["host-0002"].time == now and "a replayed report" in book.last_refusal["host-0002"]
    book.on_report("host-0002", key.sign(_report(now + 0.2)), lambda raw: verify(raw, pub))
    assert book.reports["host-0002"].time == now + 0.2 and book.rejected["host-0002"] == 2 and book.verified["host-0002"] == 2
    book.on_report("host-0005", _report(now))  # a host not enrolled: its agent's word
    assert "host-0005" in book.reports and "host-0005" not in book.verified
