"""Generate the gRPC Python code for `decision.proto` into this package.

The generated modules are build outputs (ignored by git): `scripts/setup.sh` runs this,
and `policyc.server.proto` runs it on first import when they are missing or older than
the `.proto`, so a fresh clone never serves stale stubs. grpcio-tools writes
`import decision_pb2`; we rewrite it to the package import so the stubs live under
`policyc.server` without touching `sys.path`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "decision.proto"
OUTPUTS = (HERE / "decision_pb2.py", HERE / "decision_pb2_grpc.py", HERE / "decision_pb2.pyi")


class ProtogenError(RuntimeError):
    """grpcio-tools is missing or protoc refused the file."""


def is_current() -> bool:
    """True when every generated file exists and is newer than the `.proto`."""
    src = PROTO.stat().st_mtime
    return all(p.exists() and p.stat().st_mtime >= src for p in OUTPUTS)


def generate() -> tuple[Path, ...]:
    try:
        from grpc_tools import protoc
        import grpc_tools
    except ImportError as e:  # dev extra not installed
        raise ProtogenError("grpcio-tools is not installed: `pip install -e '.[dev]'` (or run scripts/setup.sh)") from e
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    rc = protoc.main([
        "grpc_tools.protoc", f"-I{HERE}", f"-I{include}", f"--python_out={HERE}", f"--pyi_out={HERE}",
        f"--grpc_python_out={HERE}", str(PROTO),
    ])
    if rc != 0:
        raise ProtogenError(f"protoc failed on {PROTO} (exit {rc})")
    grpc_py = HERE / "decision_pb2_grpc.py"
    text = grpc_py.read_text()
    grpc_py.write_text(re.sub(r"^import decision_pb2 as", "from policyc.server import decision_pb2 as", text, flags=re.M))
    return OUTPUTS


def main() -> int:
    try:
        for p in generate():
            print(f"generated {p.relative_to(HERE.parent)}")
    except ProtogenError as e:
        print(f"policyc protogen: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
