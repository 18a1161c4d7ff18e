"""The generated message and service modules.

Import `pb` (messages) and `pb_grpc` (service stubs) from here, never the generated
modules directly. The stubs are committed (see `protogen.py`) and never regenerated at
import: an installed wheel must not write into site-packages, and a stub is a build
output that a release fixes, not something file times decide.
"""

from __future__ import annotations

from . import decision_pb2 as pb
from . import decision_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Decisions"].full_name

__all__ = ["SERVICE_NAME", "pb", "pb_grpc"]
