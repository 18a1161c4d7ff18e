"""One exit-code table for every `policyc` command (shown by `policyc --help`, in the README,
and checked by `tests/cli/test_cli_table.py`).

A code means one thing everywhere; each command's help lists the codes it can return.
"""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0  # done; admitted; equivalent; verified
    FAILED = 1  # the input has problems: policy errors, a failed test or gate, an unformatted file, a log that fails verification
    USAGE = 2  # bad arguments, an unreadable file or key, a bad configuration
    NEGATIVE = 3  # a valid negative answer: `decide` rejected the request; `diff`: NEW widens compliance
    DIFFERENT = 4  # `diff`: other differences
    UNKNOWN = 5  # `diff`: the solver could not decide
    UNAVAILABLE = 6  # the service could not be reached (connection refused, no answer before the deadline)
    REFUSED = 7  # the service refused the call (bad request, unknown tenant or instance, no permission)
    INTERRUPTED = 130  # interrupted (Ctrl-C)


MEANING: dict[Exit, str] = {
    Exit.OK: "success (decide: admitted; diff: equivalent; audit verify: the chain holds)",
    Exit.FAILED: "the input has problems: policy errors, a failed test, gate or check (fmt --check), a log that fails verification",
    Exit.USAGE: "usage: bad arguments or flags, an unreadable file or key, a bad configuration",
    Exit.NEGATIVE: "a valid negative answer: decide rejected the request; diff: NEW widens compliance",
    Exit.DIFFERENT: "diff: other differences",
    Exit.UNKNOWN: "diff: the solver could not decide",
    Exit.UNAVAILABLE: "the decision service could not be reached (connection refused, deadline passed)",
    Exit.REFUSED: "the decision service refused the call (invalid request, not found, permission denied)",
    Exit.INTERRUPTED: "interrupted",
}


def table_text() -> str:
    """The table as `policyc --help` prints it."""
    return "exit codes (every command):\n" + "\n".join(f"  {int(c):>3}  {MEANING[c]}" for c in Exit)


def table_markdown() -> str:
    """The table as the README shows it."""
    return "| exit | meaning |\n| --- | --- |\n" + "\n".join(f"| {int(c)} | {MEANING[c]} |" for c in Exit)
