"""Request bytes that are not the message they claim to be: INVALID_ARGUMENT, never UNKNOWN.

gRPC calls a method's deserializer before the method runs; when it raises (a `string`
field holding bytes that are not UTF-8, a truncated message), the client gets UNKNOWN or
INTERNAL "Exception deserializing request" and the service never hears of it. So the
deserializers here never raise: bytes that do not parse become an `Undecodable`, which
the service refuses as INVALID_ARGUMENT naming the message type and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from google.protobuf.message import DecodeError


@dataclass(frozen=True, slots=True)
class Undecodable:
    """What arrived instead of a `message` request, and why it does not parse."""

    message: str
    reason: str

    def describe(self) -> str:
        return f"the request is not a valid {self.message}: {self.reason}"


def decoder(message_type: Any) -> Callable[[bytes], Any]:
    """A request deserializer for `message_type` that returns `Undecodable` rather than raising."""
    name = message_type.DESCRIPTOR.name

    def decode(raw: bytes) -> Any:
        try:
            return message_type.FromString(raw)
        except (DecodeError, UnicodeDecodeError, ValueError, RuntimeError) as e:
            reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            return Undecodable(name, reason)

    return decode
