"""Every diagnostic code policyc reports, in one place, grouped by stage.

A code is stable: tools and people match on it (the CLI's `--format json`, the gRPC API's
`google.rpc.ErrorInfo.reason`), so it is never reused for another problem. A test checks
that every code the source reports is listed here.

    E0xx input files        E1xx syntax             E2xx structure
    E3xx units and types    E4xx names, references  E5xx/W5xx solver analyses
    E6xx bundle checks      E7xx requests and registrations (the decision service)
    E8xx policy test files (`*_test.toml`, `policyc test`)
"""

from __future__ import annotations

CODES: dict[str, str] = {
    # input files
    "E001": "a path cannot be read or listed",
    "E002": "a file is not UTF-8 text",
    "E003": "a directory holds no `.contract` files",
    "E004": "a file is too large or not a regular file",
    # syntax
    "E100": "syntax error",
    "E101": "unexpected character",
    "E102": "unexpected end of file",
    "E103": "unexpected token",
    "E104": "invalid escape in a string",
    "E105": "nested too deeply",
    "E106": "too many terms in one list or expression",
    "E107": "string too long",
    "E108": "number too long",
    "E109": "unknown unit",
    # structure
    "E201": "unknown field",
    "E202": "duplicate field or label",
    "E203": "unknown block",
    "E204": "missing required section or field",
    "E205": "duplicate block",
    "E206": "a field takes one value",
    "E207": "malformed declaration (name, header, label)",
    "E208": "conflicting fields",
    "E209": "declared twice within a block",
    "E210": "a field given where it has no effect",
    "E211": "an action listed without its configuration",
    "E212": "a configuration for an action that is not listed",
    "E213": "a field outside any block",
    "E214": "unknown top-level block",
    "E215": "a section that takes no label",
    # units and types
    "E301": "a value of the wrong type",
    "E302": "`of slo` / `of predicted` outside a circuit-break condition",
    "E303": "a quantity of the wrong unit",
    "E304": "not a finite number",
    "E305": "a value out of its allowed range",
    "E306": "a minimum or maximum not written as a bound",
    "E307": "a bound in the wrong direction",
    "E308": "a range expected",
    "E309": "an empty name",
    "E310": "not one of the allowed values",
    "E311": "listed twice",
    "E312": "not a valid HTTP header",
    "E313": "yes or no expected",
    "E314": "a whole number expected",
    "E315": "version bounds expected",
    "E316": "`range` on a variable that is not a quantity",
    "E317": "a request variable used as a condition that is not yes/no",
    "E318": "a condition that is not true or false",
    "E319": "an attribute compared with a request variable of another type",
    "E320": "`in` with a single value",
    "E321": "an ordering on a value that is not a quantity",
    "E322": "a comparison with the wrong number of values",
    "E323": "a breaker condition that is not a signal comparison",
    "E324": "a share of something that is not the SLO or the prediction",
    "E325": "an inverted or empty range",
    "E326": "unsatisfiable version bounds",
    "E327": "a count out of its allowed range",
    "E328": "a percentage over 100 %",
    "E329": "an inconsistent quarantine",
    # names and references
    "E401": "a computed variable fed by a header",
    "E402": "unknown request variable",
    "E403": "rule declared twice",
    "E404": "unknown function",
    "E405": "`has` without a request variable",
    "E406": "`when` reads an instance attribute",
    "E407": "a `when` condition that does not read the request",
    "E408": "`require` reads the request",
    "E409": "a requirement that does not constrain the instance",
    "E410": "unknown instance attribute",
    "E411": "unknown tenant class",
    "E412": "unknown signal",
    "E413": "declared twice",
    "E414": "unknown name in a rule",
    "E415": "a redirect to a model without a contract",
    # solver analyses
    "E501": "an infeasible contract",
    "E502": "a rule that can never be satisfied",
    "W501": "a rule shadowed by another",
    "W502": "feasibility undecided (solver timeout)",
    "W503": "a rule that never rejects",
    # bundle checks (on every load)
    "E601": "a GPU share that is not a share of a feasible class",
    "E602": "a request test with a comparison but no value, or the reverse",
    "E603": "an index plan that is not the one the rules give",
    "E604": "latency targets that are not the ones the rules give",
    # requests (Decide, Explain) and registrations (RegisterInstance)
    "E701": "unknown request header",
    "E702": "required request header missing",
    "E703": "malformed request header value",
    "E704": "request header given twice",
    "E705": "request header names and values must be text",
    "E706": "unknown tenant",
    "E707": "tenant header disagrees with the authenticated caller",
    "E708": "`X-Retry-Count` is not a non-negative whole number",
    "E709": "too many request headers, or a header too large",
    "E710": "unknown request attribute",
    "E711": "request attribute of the wrong type",
    "E712": "request attribute disagrees with its header",
    "E713": "request too large or not a valid message",
    "E720": "unknown model",
    "E721": "the deployment does not satisfy the contract",
    "E722": "the registered contract differs from the bundle's",
    "E723": "an invalid field of the registration",
    "E724": "instance already registered, or not registered",
    "E725": "an endpoint a registration may not name (the gateway's own ports, metadata, link-local, another host's)",
    "E726": "the registered model's counted cost is outside its contract beyond the gate's tolerance (contract drift)",
    "E727": "the registered model's cost cannot be counted (an op without a rule, or shapes left unresolved)",
    # the fleet store and attested host facts (policyc.cluster)
    "E730": "a registry write the fleet store did not confirm: its outcome is unknown until the store answers",
    "E731": "a request id reused for a different request",
    "E732": "a host fact claimed without a verified attestation",
    "E733": "a host fact claimed that the host's own agent reports otherwise",
    # policy test files
    "E801": "a test file that is not valid TOML",
    "E802": "a test file's field is missing, unknown or of the wrong type",
}


def describe(code: str) -> str:
    """The one-line meaning of a code, or a sentence saying it is unknown."""
    return CODES.get(code, f"unknown code `{code}`")
