"""What the decision service takes from a host agent, checked before use: a signals report
that is not one (not JSON, a string where a number belongs, too many entries, too large) is
refused with its reason and the host's last good report stays; an act order that is not one
(an unknown step, fields missing) is refused by name."""

from __future__ import annotations

import json

import pytest

from policyc.cluster.host_acts import Order
from policyc.cluster.measured_hosts import MAX_REPORT_BYTES, HostReport, HostSignalBook

GOOD = {"time": 1e9, "agent": {"period_s": 0.2, "jitter_s": 0.001},
        "interfaces": {"eth0": {"backlog_bytes": 5e4, "fill": 0.5, "tx_Bps": 1e5, "up": 1.0}}, "disks": {}, "processes": {}}


@pytest.mark.parametrize("raw, words", [
    (b"{", "not a report"),
    (json.dumps({**GOOD, "time": "soon"}).encode(), "could not convert string to float"),
    (json.dumps({**GOOD, "interfaces": {"eth0": {"up": "yes"}}}).encode(), "interfaces.eth0.up: not a number"),
    (json.dumps({**GOOD, "disks": {f"d{i}": {} for i in range(65)}}).encode(), "disks: an object of at most 64"),
    (json.dumps({**GOOD, "agent": {"period_s": 0}}).encode(), "out of range"),
    (b" " * (MAX_REPORT_BYTES + 1), f"at most {MAX_REPORT_BYTES}"),
])
def test_a_report_that_is_not_one_is_refused_and_the_last_good_one_stays(raw: bytes, words: str) -> None:
    book = HostSignalBook()
    book.on_report("host-0002", json.dumps(GOOD).encode())
    book.on_report("host-0002", raw)
    assert words in book.refused["host-0002"]
    assert book.reports["host-0002"].interfaces["eth0"]["fill"] == 0.5
    with pytest.raises(ValueError, match="signals of host-0002"):
        HostReport.parse("host-0002", raw)
    assert book.status(now=1e9 + 0.5)["host-0002"]["refused"] == book.refused["host-0002"]


def test_staleness_follows_the_agents_own_period() -> None:
    book = HostSignalBook()
    book.on_report("h", json.dumps({**GOOD, "agent": {"period_s": 2.0}}).encode())
    assert book.stale_after(book.reports["h"]) == 10.0  # five of its periods
    assert not book.status(now=1e9 + 9)["h"]["stale"] and book.status(now=1e9 + 11)["h"]["stale"]
    book.on_report("h", json.dumps(GOOD).encode())
    assert book.stale_after(book.reports["h"]) == 1.0  # at least a second


def test_an_order_that_is_not_one_is_refused_by_name() -> None:
    good = Order("a1", "host-0005", "link_refresh", "eth1", True, 7, "r0", "rule", 1e9)
    assert Order.decode(good.encode()) == good
    with pytest.raises(ValueError, match="unknown step `format_disk`"):
        Order.decode(json.dumps({**good.__dict__, "step": "format_disk"}).encode())
    with pytest.raises(ValueError, match="not an act order"):
        Order.decode(json.dumps({"id": "x"}).encode())
