"""Table-driven bad inputs: each asserts the code, the message and the `line:col`.

Expected errors are written by hand and never regenerated: they are the user-facing
contract. Sources are compiled in memory as `f0.contract`, `f1.contract`, …
"""

from __future__ import annotations

import pytest

from policy_text import BASE_CONTRACT, REQUESTS, compile_text


def edit(old: str, new: str, base: str = BASE_CONTRACT) -> str:
    assert old in base, old
    return base.replace(old, new, 1)


POLICY = REQUESTS + BASE_CONTRACT


def rule(body: str) -> str:
    return POLICY + "policy p {\n  rule r {\n" + body + "\n  }\n}\n"


# (id, sources, code, message fragment, file, line, col)
CASES = [
    # --- syntax (E1xx)
    ("bad-char", [edit("tokens: 128", "tokens: $128")], "E101", "unexpected character `$`", "f0", 4, 13),
    ("eof", [BASE_CONTRACT.rstrip().rstrip("}")], "E102", "unexpected end of file", "f0", 16, 4),
    ("double-colon", [edit("tokens: 128", "tokens: 128 :")], "E103", "unexpected `:`", "f0", 4, 17),
    ("bad-escape", [edit('version "1.0"', 'version "1\\q"')], "E104", "invalid escape", "f0", 1, 20),
    # --- structure (E2xx)
    ("top-level-field", ["name: x\n"], "E213", "`name:` must be inside a block", "f0", 1, 1),
    ("unknown-top-block", [edit("contract m", "contrct m")], "E214", "unknown block `contrct`", "f0", 1, 1),
    ("contract-no-version", [edit('contract m version "1.0" {', "contract m {")], "E207", "contract NAME version", "f0", 1, 10),
    ("missing-compute", [edit("  compute {\n    flops_per_request: 1e12 .. 2e12\n    tokens: 128\n  }\n", "")],
     "E204", "contract `m` is missing required section `compute`", "f0", 1, 1),
    ("missing-memory", [edit("  memory {\n    bandwidth: >= 80 GB/s\n    burst: <= 200 ms\n  }\n", "")],
     "E204", "missing required section `memory`", "f0", 1, 1),
    ("missing-dependencies", [edit("  dependencies {\n    async_callbacks: no\n    cuda: >= 12.1\n  }\n", "")],
     "E204", "missing required section `dependencies`", "f0", 1, 1),
    ("unknown-field", [edit("bandwidth: >=", "bandwith: >=")], "E201", "unknown field `bandwith` in `memory` of contract `m`", "f0", 7, 5),
    ("duplicate-field", [edit("tokens: 128", "tokens: 128\n    tokens: 256")], "E202", "duplicate field `tokens`", "f0", 5, 5),
    ("missing-field", [edit("    burst: <= 200 ms\n", "")], "E204", "`memory` of contract `m` is missing required field `burst`", "f0", 6, 3),
    ("field-as-block", [edit("  slo {\n    latency: <= 200 ms\n  }\n", "  slo: 200 ms\n")], "E201", "unknown field `slo`", "f0", 14, 3),
    # --- units and types (E3xx)
    ("bandwidth-is-time", [edit(">= 80 GB/s", ">= 80 ms")], "E303", "`bandwidth` expects a bandwidth", "f0", 7, 19),
    ("burst-direction", [edit("burst: <= 200 ms", "burst: >= 200 ms")], "E307", "`burst` is a maximum, so it takes `<=`", "f0", 8, 12),
    ("bound-missing", [edit(">= 80 GB/s", "80 GB/s")], "E306", "`bandwidth` is a minimum: write it as a bound", "f0", 7, 16),
    ("flops-both", [edit("tokens: 128", "flops_per_token: 1e9 .. 2e9\n    tokens: 128")], "E208", "both `flops_per_request` and `flops_per_token`", "f0", 4, 5),
    ("flops-missing", [edit("    flops_per_request: 1e12 .. 2e12\n", "")], "E204", "missing required field `flops_per_request`", "f0", 2, 3),
    ("flops-not-range", [edit("1e12 .. 2e12", "1e12")], "E308", "expects a range `low .. high`", "f0", 3, 24),
    ("tokens-fraction", [edit("tokens: 128", "tokens: 12.5")], "E314", "`tokens` expects a whole number", "f0", 4, 13),
    ("precision-unknown", [edit("tokens: 128", "tokens: 128\n    precision: fp12")], "E310", "`fp12` is not a valid `precision`", "f0", 5, 16),
    ("efficiency-over", [edit("tokens: 128", "tokens: 128\n    efficiency: 120 %")], "E305", "`efficiency` cannot exceed 100 %", "f0", 5, 17),
    ("zero-bandwidth", [edit(">= 80 GB/s", ">= 0 GB/s")], "E305", "`bandwidth` must be greater than zero", "f0", 7, 19),
    ("async-not-bool", [edit("async_callbacks: no", "async_callbacks: maybe")], "E313", "`async_callbacks` expects yes or no", "f0", 11, 22),
    ("cuda-bad", [edit("cuda: >= 12.1", 'cuda: "twelve"')], "E315", "`cuda` expects version bounds", "f0", 12, 11),
    ("of-outside-breaker", [edit("latency: <= 200 ms", "latency: <= 90 % of slo")], "E302", "`of slo` is only allowed in circuit-break conditions", "f0", 15, 25),
    ("security-unknown", [edit("  slo {", "  placement { security: [tpm, secure_boot] }\n  slo {")], "E310", "`secure_boot` is not a valid `security`", "f0", 14, 31),
    ("region-twice", [edit("  slo {", "  placement { regions: [us-west, us-west] }\n  slo {")], "E311", "`us-west` is listed twice", "f0", 14, 34),
    ("service-no-p99", [edit("async_callbacks: no", "service cache { kind: redis }\n    async_callbacks: no")],
     "E204", "service `cache` is missing required field `p99`", "f0", 11, 5),
    ("header-no-missing", ["request {\n  header X-A { var: a  type: time  malformed: reject }\n}\n"],
     "E204", "header `X-A` is missing required field `missing`", "f0", 2, 3),
    ("header-default-unused", ["request {\n  header X-A { var: a  type: time  missing: ignore  default: 1 s  malformed: reject }\n}\n"],
     "E210", "`default` is only used with `missing: default`", "f0", 2, 53),
    ("header-default-absent", ["request {\n  header X-A { var: a  type: time  missing: default  malformed: reject }\n}\n"],
     "E204", "says `missing: default` but gives no `default`", "f0", 2, 36),
    ("header-default-wrong-unit", ["request {\n  header X-A { var: a  type: time  missing: default  default: 5 GB/s  malformed: reject }\n}\n"],
     "E303", "`default` expects a time", "f0", 2, 63),
    # --- rules: names and types (E3xx / E4xx)
    ("unknown-request-var", [rule("    when: has(request.sloo)\n    require: tpm")], "E402", "unknown request variable `sloo`", "f0", 26, 15),
    ("unknown-attribute", [rule("    require: regoin == us-west")], "E410", "unknown instance attribute `regoin`", "f0", 26, 14),
    ("unit-mismatch", [rule("    require: slo_latency <= 80 GB/s")], "E303", "`slo_latency` is a time", "f0", 26, 29),
    ("var-type-mismatch", [rule("    require: bandwidth >= request.slo")], "E319", "`bandwidth` is a bandwidth", "f0", 26, 14),
    ("when-reads-instance", [rule("    when: tpm\n    require: tpm")], "E406", "`when` reads the request only", "f0", 26, 11),
    ("require-reads-request", [rule("    require: request.slo >= 5 ms")], "E408", "`require` constrains the instance", "f0", 26, 14),
    ("order-on-name", [rule("    require: region < us-west")], "E321", "`<` orders quantities", "f0", 26, 23),
    ("unknown-tenant-class", [rule("    when: request.tenant_class == finanse\n    require: tpm")], "E411", "no tenant has class `finanse`", "f0", 26, 35),
    ("undeclared-value", [rule("    when: request.region == mars-1\n    require: tpm")], "E310", "`mars-1` is not a declared value of `request.region`", "f0", 26, 29),
    ("in-needs-list", [rule("    require: region in us-west")], "E320", "`in` takes a list", "f0", 26, 24),
    ("unknown-function", [rule("    when: exists(request.slo)\n    require: tpm")], "E404", "unknown function `exists`", "f0", 26, 11),
    ("unknown-model", [rule("    require: model == fraud")], "E414", "unknown model (no contract of that name) `fraud`", "f0", 26, 14),
    ("duplicate-contract", [BASE_CONTRACT, BASE_CONTRACT], "E413", "contract `m` is declared twice", "f1", 1, 1),
    ("duplicate-rule", [POLICY + "policy p {\n  rule r { require: tpm }\n  rule r { require: tee }\n}\n"], "E403", "rule `r` is declared twice", "f0", 26, 8),
    # --- breakers
    ("unknown-signal", [BASE_CONTRACT + "breaker b {\n  scope: gpu\n  when: sm_util < 20 %\n  actions: [report_anomaly]\n}\n"],
     "E412", "unknown signal `sm_util`", "f0", 20, 9),
    ("breaker-or", [BASE_CONTRACT + "breaker b {\n  scope: gpu\n  when: sm_utilization < 20 % or error_rate > 5 %\n  actions: [report_anomaly]\n}\n"],
     "E323", "a breaker condition compares a signal", "f0", 20, 9),
    ("redirect-unknown-backup", [BASE_CONTRACT + "breaker b {\n  scope: request\n  when: elapsed >= 90 % of slo\n  actions: [redirect]\n  redirect { backup: lite }\n}\n"],
     "E415", "redirects to `lite`, which has no contract", "f0", 18, 1),
    ("action-without-config", [BASE_CONTRACT + "breaker b {\n  scope: request\n  when: elapsed >= 150 ms\n  actions: [cancel_stream, redirect]\n}\n"],
     "E211", "lists `redirect` but has no `redirect { … }` block", "f0", 21, 3),
    ("of-slo-wrong-signal", [BASE_CONTRACT + "breaker b {\n  scope: request\n  when: tls_handshake >= 90 % of slo\n  actions: [cancel_stream]\n}\n"],
     "E324", "only `elapsed` may be written as a share of the SLO", "f0", 20, 26),
    ("of-unknown-quantity", [BASE_CONTRACT + "breaker b {\n  scope: request\n  when: elapsed >= 90 % of budget\n  actions: [cancel_stream]\n}\n"],
     "E324", "share of the SLO or of the placement's predicted latency", "f0", 20, 20),
    ("signal-unit", [BASE_CONTRACT + "breaker b {\n  scope: request\n  when: elapsed >= 90 %\n  actions: [cancel_stream]\n}\n"],
     "E303", "`elapsed` is a time (ns, us, ms, s, min), found a percentage", "f0", 20, 20),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(case):
    _, texts, code, fragment, file, line, col = case
    result = compile_text(*texts)
    assert result.bundle is None, "a bad input must not produce a bundle"
    found = [d for d in result.errors if d.code == code]
    assert found, f"expected {code}, got {[(d.code, d.message) for d in result.errors]}"
    d = found[0]
    assert fragment in d.message, d.message
    assert (d.span.file, d.span.line, d.span.col) == (f"{file}.contract", line, col), str(d.span)


def test_case_count():
    assert len({c[0] for c in CASES}) >= 30


def test_every_error_is_reported_not_only_the_first():
    text = edit("bandwidth: >=", "bandwith: >=", edit("tokens: 128", "tokens: 12.5", edit("async_callbacks: no", "async_callbacks: maybe")))
    result = compile_text(text)
    assert {d.code for d in result.errors} >= {"E201", "E314", "E313"}


def test_help_suggests_the_closest_name():
    d = next(d for d in compile_text(edit("bandwidth: >=", "bandwith: >=")).errors if d.code == "E201")
    assert d.help == "did you mean `bandwidth`?"
