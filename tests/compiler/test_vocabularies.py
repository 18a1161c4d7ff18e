"""The closed vocabularies are declared once, in a table every layer reads: the breaker
actions (`compiler/actions.py`) and the header value types (`compiler/value_types.py`).
The bundle's schema agrees with each table, and the layers that used to spell the words
themselves (the compiler's lowering and checks, the rule table, the guardian, the gateway's
acts, the matcher's header parser) no longer do."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from policyc.compiler import actions, value_types
from policyc.compiler.breakers import ACTIONS
from policyc.compiler.bundle import Action, Breaker, Bundle, CancelStream, ReportAnomaly, SelfHeal, SignalCondition, ValueType
from policyc.compiler.meaning import QUANTITY_KINDS, ValueKind
from policyc.compiler.requests import HEADER_TYPES
from policyc.enforcer.rule_table import RuleTableError, build_rule_table

ROOT = Path(__file__).resolve().parents[2]
READ_ACTIONS = ("compiler/breakers.py", "enforcer/rule_table.py", "enforcer/guardian.py", "gateway/acts.py",
                "enforcer/records.py", "gateway/runner.py")
READ_TYPES = ("compiler/requests.py", "compiler/check_values.py", "compiler/rules.py", "matcher/parse.py")


def _constants(path: str) -> list[tuple[int, str]]:
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_the_action_table_is_the_bundles_action_union() -> None:
    union = typing.get_args(typing.get_args(Action)[0])
    assert {m.model_fields["kind"].default for m in union} == set(actions.KINDS)
    assert {a.model for a in actions.TABLE} == set(union)
    assert ACTIONS == actions.KINDS
    assert set(actions.CONFIGURED) == {"redirect", "quarantine", "self_heal"}  # the DSL's blocks, as documented
    for a in actions.TABLE:
        assert a.scopes and set(a.scopes) <= set(actions.SCOPES) and a.does


@pytest.mark.parametrize("path", READ_ACTIONS)
def test_the_layers_spell_no_action(path: str) -> None:
    spelled = [(line, v) for line, v in _constants(path) if v in actions.KINDS]
    assert not spelled, f"{path} spells breaker actions itself: {spelled}"




def _breaker(scope: str, *acts: object) -> Breaker:
    from policyc.compiler.bundle import SourceRef

    ref = SourceRef(file="t.contract", line=1, col=1)
    return Breaker(name="b", scope=scope, conditions=(SignalCondition(signal="elapsed", cmp=">=", value=0.1, origin=ref),),
                   actions=acts, origin=ref)  # type: ignore[arg-type]


@pytest.mark.parametrize(("scope", "act", "ok"), [
    ("request", CancelStream(), True), ("gpu", CancelStream(), False), ("gpu", SelfHeal(steps=("rebalance",)), True),
    ("request", SelfHeal(steps=("rebalance",)), False), ("backend", ReportAnomaly(), True),
])
def test_scopes_come_from_the_table(scope: str, act: object, ok: bool) -> None:
    b = _breaker(scope, act)
    assert (actions.scope_problem(act, scope) is None) is ok
    bundle = Bundle.model_construct(breakers=(b,), contracts=(), gpus=(), headers=(), tenants=(), rules=())
    if ok:
        build_rule_table(bundle)
    else:
        with pytest.raises(RuleTableError, match=f"{actions.kind(act)} acts in a rule of scope"):
            build_rule_table(bundle)


def test_the_audit_schema_records_every_action_the_enforcer_takes() -> None:
    """The audit log's kinds (a pydantic `Literal`, so spelled in the schema) hold every
    breaker action a request, GPU or backend rule runs (self-heal is recorded by its steps)."""
    from policyc.audit.records import ActionKind as AuditKind
    from policyc.enforcer.records import ActionKind

    recorded = set(typing.get_args(AuditKind))
    for kind in actions.KINDS:
        if kind != actions.SELF_HEAL:
            assert kind in recorded and ActionKind(kind).value == kind


def test_the_guardian_dispatches_only_the_tables_words_in_their_scopes() -> None:
    from policyc.enforcer import guardian

    src = (ROOT / "enforcer/guardian.py").read_text(encoding="utf-8")
    assert "isinstance(action," not in src and "isinstance(a, CancelStream)" not in src
    assert guardian.CANCEL_STREAM == actions.CANCEL_STREAM


def test_the_value_type_table_is_the_bundles_value_type() -> None:
    assert set(value_types.WORDS) == set(typing.get_args(ValueType)) == {str(k) for k in ValueKind}
    assert value_types.QUANTITIES == {str(k) for k in QUANTITY_KINDS}
    assert HEADER_TYPES == value_types.HEADER_TYPES
    assert value_types.takes_values("name") and not value_types.takes_values("string")
    assert value_types.takes_range("time") and not value_types.takes_range("bool")
    assert value_types.fits(True, "bool") and not value_types.fits(1, "bool") and not value_types.fits(True, "count")
    assert not value_types.fits(float("nan"), "time") and value_types.fits("x", "string")


@pytest.mark.parametrize("path", READ_TYPES)
def test_the_header_layers_compare_no_type_word(path: str) -> None:
    """No comparison with, or tuple of, a value type's word: the table's kinds decide."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    words = set(value_types.WORDS)
    bad = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Compare):
            for c in (n.left, *n.comparators):
                if isinstance(c, ast.Constant) and c.value in words:
                    bad.append((n.lineno, c.value))
                if isinstance(c, (ast.Tuple, ast.Set, ast.List)) and any(
                        isinstance(e, ast.Constant) and e.value in words for e in c.elts):
                    bad.append((n.lineno, "a tuple of type words"))
    assert not bad, f"{path} decides on value type words itself: {bad}"
