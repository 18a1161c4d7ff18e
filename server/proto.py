"""The generated message and service modules, generated on first use when missing or stale.

Import `pb` (messages) and `pb_grpc` (service stubs) from here, never the generated
modules directly, so a checkout that skipped `scripts/setup.sh` still works.
"""

from __future__ import annotations

from . import protogen

if not protogen.is_current():
    protogen.generate()

from . import decision_pb2 as pb  # noqa: E402
from . import decision_pb2_grpc as pb_grpc  # noqa: E402

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Decisions"].full_name

__all__ = ["SERVICE_NAME", "pb", "pb_grpc"]
