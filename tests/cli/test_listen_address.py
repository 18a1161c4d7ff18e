"""`--host` takes an IP address or localhost; anything else is a usage error naming the
flag (exit 2), before the transport could call a typo "refusing plaintext"."""

from __future__ import annotations

import pytest

from policyc.cli.listen_address import check_listen_host
from policyc.cli.main import main


@pytest.mark.parametrize("given, kept", [
    ("127.0.0.1", "127.0.0.1"), ("0.0.0.0", "0.0.0.0"), ("::1", "::1"), ("[::1]", "::1"), ("::", "::"),
    ("10.0.1.1", "10.0.1.1"), ("localhost", "localhost"), ("fe80::1%eth0", "fe80::1%eth0"),
])
def test_addresses_are_kept(given: str, kept: str) -> None:
    assert check_listen_host(given) == kept


@pytest.mark.parametrize("given, says", [
    ("not-an-address", "is not an IP address"), ("0.0.0.0:50051", "the port has its own flag"),
    ("", "is not an IP address"), ("256.1.1.1", "is not an IP address"), ("127.0.0.1\n", "`127.0.0.1\\n`"),
    ("x" * 5000, "..."), ("example.com", "is not an IP address"),
])
def test_anything_else_is_refused_with_its_reason(given: str, says: str) -> None:
    with pytest.raises(ValueError) as e:
        check_listen_host(given)
    assert says in str(e.value) and len(str(e.value)) < 300


def test_serve_reports_a_bad_host_as_usage_not_plaintext(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["serve", "--bundle", "no-such-bundle.json", "--host", "not-an-address"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --host: `not-an-address` is not an IP address" in err and "refusing plaintext" not in err
