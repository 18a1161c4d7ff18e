"""`policyc test`: policy authors' own test files, run against the compiled bundle.

A test file (`*_test.toml`) holds a fleet fixture and cases. A score belongs to a (model,
GPU) group, as in the registry: copies of a model on one GPU that give different scores are
a fixture error naming both.

    [[instance]]                      # the fleet: registered as the decision service would
    id = "fraud-usw-1"
    model = "fraud-scorer"
    score = 0.9                       # optional: its (model, GPU) group's, 0.5 for a new group
    labels = { rack = "r1" }          # optional
    deployment = { host = "h1", gpu = "gpu0", gpu_model = "A100-80G", region = "us-west", tpm = true }

    [[case]]
    name = "finance lands on hardened hardware"
    headers = { X-Tenant = "acme-bank", X-SLO-Latency = "250ms" }
    admitted = true                   # at least one instance may serve it
    instances = ["fraud-usw-1"]       # optional: exactly these may
    best = "fraud-usw-1"              # optional: the best-scored one
    reason = "compliance.healthcare-eu"   # optional, when not admitted: a rule that blocks it
    error_header = "X-SLO-Latency"    # optional: the request is refused for this header

Why a case is not admitted: a refused request names its header; otherwise the *blocking*
rules are the applied rules whose removal alone would admit some instance, or, when no
single rule does, every applied rule that eliminates something. `reason` must be one of
them. Coverage (like `opa test --coverage`): a rule is exercised when it applied in at
least one case; the report lists the rules no case exercised.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from policyc.compiler.bundle import Bundle, RequestRule
from policyc.compiler.diagnostic import Diagnostic

from .errors import RegistryError, RequestError
from policyc.compiler.semantics import admits
from .instance import Deployment
from .instance import Instance as InstanceModel
from .registry import Registry


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FleetEntry(_Strict):
    id: str
    model: str
    deployment: Deployment
    labels: dict[str, str] = Field(default_factory=dict)
    score: float | None = None  # None: the group's score (`DEFAULT_SCORE` for a new group)


class Case(_Strict):
    name: str
    headers: dict[str, str] = Field(default_factory=dict)
    tenant: str | None = None
    admitted: bool
    instances: list[str] | None = None
    best: str | None = None
    reason: str | None = None
    error_header: str | None = None


class TestFile(_Strict):
    instance: list[FleetEntry] = Field(default_factory=list)
    case: list[Case] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class CaseResult:
    file: str
    name: str
    passed: bool
    failures: tuple[str, ...]
    applied: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Report:
    results: tuple[CaseResult, ...]
    errors: tuple[str, ...]  # files that could not be loaded, with the place and problem
    uncovered: tuple[RequestRule, ...]
    rules: int

    @property
    def ok(self) -> bool:
        return not self.errors and all(r.passed for r in self.results)


class TestFileError(ValueError):
    """A test file that cannot be run: the message, and where there are any, its located
    diagnostics and the file's text, so that `policyc test` can print them as the compiler
    prints its own (source line and caret)."""

    def __init__(self, message: str, diagnostics: Iterable[Diagnostic] = (), path: str = "", text: str = "") -> None:
        super().__init__(message)
        self.diagnostics = tuple(diagnostics)
        self.path = path
        self.text = text


def load(path: Path) -> TestFile:
    """The test file, or TestFileError carrying every problem as a located diagnostic
    (test_file_errors.py)."""
    from .test_file_errors import plain, toml_error, validation_errors

    name = path.as_posix()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise TestFileError(f"{name}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise TestFileError(f"{name}: not UTF-8 text (byte offset {e.start})") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        diags = [toml_error(name, text, e)]
        raise TestFileError(plain(diags), diags, name, text) from None
    try:
        return TestFile.model_validate(raw)
    except ValidationError as e:
        diags = validation_errors(name, text, raw, e, TestFile)
        raise TestFileError(plain(diags), diags, name, text) from None


def run_case(reg: Registry, case: Case, file: str) -> CaseResult:
    failures: list[str] = []
    try:
        request = reg.parse_request(case.headers, case.tenant)
    except RequestError as e:
        if case.admitted:
            failures.append(f"expected admitted, but the request was refused: {e}")
        elif case.error_header is not None and case.error_header.lower() not in {(p.field or "").lower() for p in e.problems}:
            failures.append(f"expected a refusal naming header `{case.error_header}`, got: {e}")
        elif case.reason is not None and case.reason.lower() not in {(p.field or "").lower() for p in e.problems}:
            failures.append(f"expected reason `{case.reason}`, but the request was refused: {e}")
        return CaseResult(file, case.name, not failures, tuple(failures), ())
    if case.error_header is not None:
        failures.append(f"expected a refusal naming header `{case.error_header}`, but the request parsed")
    m = reg.match(request, max(len(reg), 1))
    applied = tuple(r.id for r in m.rules)
    got = [s.instance.id for s in m.best]
    if m.admitted != case.admitted:
        failures.append(f"expected {'admitted' if case.admitted else 'not admitted'}, got "
                        f"{'admitted by ' + ', '.join(got) if m.admitted else 'no instance'}")
    if case.instances is not None and sorted(case.instances) != sorted(got):
        failures.append(f"expected instances {sorted(case.instances)}, got {sorted(got)}")
    if case.best is not None and (not got or got[0] != case.best):
        failures.append(f"expected best `{case.best}`, got `{got[0] if got else 'none'}`")
    if case.reason is not None:
        reasons = _reasons(reg, applied, request.vars)
        if case.reason not in reasons:
            failures.append(f"expected reason `{case.reason}`, blocking rules are: {', '.join(reasons) or 'none'}")
    return CaseResult(file, case.name, not failures, tuple(failures), applied)


def _reasons(reg: Registry, applied: tuple[str, ...], vars) -> tuple[str, ...]:
    by_id = {r.id: r for r in reg.bundle.rules}
    rules = [by_id[i] for i in applied]
    entries = reg.entries()
    critical = tuple(r.id for r in rules
                     if any(admits([o for o in rules if o is not r], attrs, vars) for _, attrs, _ in entries))
    if critical:
        return critical
    return tuple(r.id for r in rules if any(not admits([r], attrs, vars) for _, attrs, _ in entries))


def _score_clash(fleet: list[FleetEntry]) -> str | None:
    """The first two copies of a model on one GPU that give different scores (one score
    serves them both in the registry, so the fixture would not mean what it says)."""
    given: dict[tuple[str, str, str], FleetEntry] = {}
    for e in fleet:
        if e.score is None:
            continue
        key = (e.model, e.deployment.host, e.deployment.gpu)
        first = given.setdefault(key, e)
        if first.score != e.score:
            return (f"instances `{first.id}` (score {first.score:g}) and `{e.id}` (score {e.score:g}) are copies of "
                    f"`{e.model}` on {key[1]}/{key[2]}, which share one score: give them the same score or one of them none")
    return None


def run_files(bundle: Bundle, files: list[Path], render: Callable[[TestFileError], str] = str) -> Report:
    """Every case of every file; a file that cannot be run is one of the report's errors,
    in the words `render` gives it (the CLI's shows source lines and carets)."""
    results: list[CaseResult] = []
    errors: list[str] = []
    for path in files:
        try:
            tf = load(path)
        except TestFileError as e:
            errors.append(render(e))
            continue
        name = path.as_posix()
        reg = Registry(bundle)
        clash = _score_clash(tf.instance)
        if clash:
            errors.append(f"{name}: fleet fixture: {clash}")
            continue
        try:
            for inst in tf.instance:
                reg.add(InstanceModel(id=inst.id, model=inst.model, deployment=inst.deployment, labels=inst.labels), inst.score)
        except RegistryError as e:
            errors.append(f"{name}: fleet fixture: {e}")
            continue
        for case in tf.case:
            results.append(run_case(reg, case, name))
    exercised = {rid for r in results for rid in r.applied}
    uncovered = tuple(r for r in bundle.rules if r.id not in exercised)
    return Report(tuple(results), tuple(errors), uncovered, len(bundle.rules))
