"""The matcher's errors: each names the place (header, instance id) and the problem.

They are ordinary exceptions carrying the one `Diagnostic` shape (a code from
`policyc.compiler.codes`, the header as the `field`), so that the decision service can turn
them into `INVALID_ARGUMENT` details (`google.rpc.BadRequest`, `ErrorInfo`) and the CLI can
print them without a traceback.
"""

from __future__ import annotations

from policyc.compiler.diagnostic import Diagnostic, error


def header_problem(code: str, header: str, message: str, help: str | None = None) -> Diagnostic:
    """One problem with one request header (`header` as the policy declares it)."""
    return error(code, message, None, help, field=header)


def detail(d: Diagnostic) -> str:
    """The one-line form of a request problem: header `X-Tenant`: unknown tenant `acme`."""
    return f"header `{d.field}`: {d.message}" if d.field else d.message


class RequestError(ValueError):
    """A request the policy refuses before matching: unknown, missing or malformed headers,
    an unknown tenant. Carries every problem found; `header`/`message` are the first."""

    def __init__(self, problems: list[Diagnostic] | tuple[Diagnostic, ...]) -> None:
        if not problems:
            raise ValueError("RequestError needs at least one problem")
        self.problems: tuple[Diagnostic, ...] = tuple(problems)
        super().__init__("; ".join(detail(p) for p in self.problems))

    @property
    def header(self) -> str:
        return self.problems[0].field or ""

    @property
    def message(self) -> str:
        return self.problems[0].message


class RegistryError(ValueError):
    """A registry update that cannot be applied; the message names the instance."""


class AdmissionError(RegistryError):
    """The instance's deployment does not satisfy its contract (`admission_problems`)."""

    def __init__(self, instance_id: str, problems: list[str]) -> None:
        self.instance_id = instance_id
        self.problems: tuple[str, ...] = tuple(problems)
        super().__init__(f"instance `{instance_id}` cannot be registered: " + "; ".join(problems))


class UnknownInstanceError(RegistryError, KeyError):
    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        super().__init__(f"no instance `{instance_id}` is registered")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])
