"""Redaction never leaks a redacted header into the log, whatever the header's case, its
value, or where else the value was copied in the record."""

from __future__ import annotations

import json
import string
import tempfile
from pathlib import Path

from audit_helpers import decision
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from policyc.audit.log import AuditLog
from policyc.audit.query import AuditReader
from policyc.audit.redaction import REDACTED

secret_text = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=8, max_size=40).filter(
    lambda s: s.strip() == s and REDACTED not in s and s[0] not in "[]" and s[-1] not in "[]"
)
names = st.sampled_from(["Authorization", "authorization", "AUTHORIZATION", "X-Api-Key", "x-api-key", "Cookie"])


def _raw(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*") if p.is_file())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(header=names, secret=secret_text, copy_to_var=st.booleans(), copy_to_reason=st.booleans(), copy_to_other_header=st.booleans())
def test_redacted_value_never_reaches_the_file(header: str, secret: str, copy_to_var: bool, copy_to_reason: bool, copy_to_other_header: bool) -> None:
    with tempfile.TemporaryDirectory() as d:
        db = Path(d) / "audit.db"
        request = {header: secret, "X-SLO-Latency": "150ms"}
        if copy_to_other_header:
            request["X-Forwarded-Credential"] = f"via proxy {secret}"
        rec = decision(
            1,
            request=request,
            variables={"token": secret} if copy_to_var else {},
            reason=f"rejected for {secret}" if copy_to_reason else None,
        )
        # the value must not occur in the record by coincidence (e.g. "00000000" in a float)
        assume(secret not in decision(1, request={}, variables={}, reason=None).model_dump_json())
        with AuditLog.open(db, redact=("authorization", "x-api-key", "cookie"), durability="normal") as log:
            log.append_decision(rec)
            raw = _raw(db)  # while open: WAL included
        raw += _raw(db)
        for form in {secret.encode(), json.dumps(secret)[1:-1].encode(), json.dumps(secret, ensure_ascii=False)[1:-1].encode()}:
            assert form not in raw
        with AuditReader.open(db) as reader:
            entry = reader.decision(rec.decision_id)
        assert entry is not None
        stored = entry.record
        assert stored.request[header] == REDACTED  # type: ignore[union-attr]
        assert stored.request["X-SLO-Latency"] == "150ms"  # type: ignore[union-attr]


def test_unnamed_headers_are_kept_and_names_match_any_case(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    rec = decision(2, request={"X-Tenant-Token": "tt-" + string.ascii_letters, "authorization": "Bearer abcdefgh"})
    with AuditLog.open(db, redact=("X-Tenant-Token", "Authorization")) as log:
        log.append_decision(rec)
    with AuditReader.open(db) as reader:
        entry = reader.decision(rec.decision_id)
    assert entry is not None
    assert entry.record.request == {"X-Tenant-Token": REDACTED, "authorization": REDACTED}  # type: ignore[union-attr]
    assert b"abcdefgh" not in _raw(db)
