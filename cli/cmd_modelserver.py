"""`policyc modelserver`: serve ONNX models carrying their contracts with KServe over the
Open Inference Protocol (v2 gRPC and REST); see `modelserver/command.py` for the options.

Exit codes: 0 stopped by SIGTERM/SIGINT; 1 a port could not be bound; 2 usage errors (no
model, a bad NAME=VALUE pair, a model file that cannot be served).
"""

from __future__ import annotations

import argparse


def register(sub) -> None:  # type: ignore[no-untyped-def]
    from policyc.modelserver.command import add_arguments

    p = sub.add_parser("modelserver", help="serve ONNX models with KServe (OIP v2 gRPC and REST)")
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from policyc.modelserver.command import run as serve

    return serve(args)
