"""Generate the gRPC Python code for `decision.proto` (a developer's tool, never run at import).

The generated modules are committed next to the `.proto`, so a wheel, an sdist and a
checkout all carry the same stubs and nothing runs protoc at build or import time. They
are written by the grpcio-tools pinned in the dev extra (`GRPCIO_TOOLS`), whose protoc
writes protobuf `STUB_PROTOBUF` gencode: the runtime floor in `pyproject.toml` is that
version, because protobuf refuses gencode newer than its runtime (the upper bound follows
kserve, which caps protobuf below 7 today).

After editing `decision.proto`: `python -m policyc.server.protogen`, then commit the three
generated files. `python -m policyc.server.protogen --check` exits 1 when they are stale
(the packaging tests run the same check). grpcio-tools writes `import decision_pb2`; we
rewrite it to the package import so the stubs live under `policyc.server` without
touching `sys.path`.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "decision.proto"
NAMES = ("decision_pb2.py", "decision_pb2_grpc.py", "decision_pb2.pyi")
OUTPUTS = tuple(HERE / n for n in NAMES)
GRPCIO_TOOLS = "1.81.1"
STUB_PROTOBUF = "6.33.5"


class ProtogenError(RuntimeError):
    """grpcio-tools is missing, is not the pinned version, or protoc refused the file."""


def _protoc():  # type: ignore[no-untyped-def]
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError as e:  # dev extra not installed
        raise ProtogenError("grpcio-tools is not installed: `pip install -e '.[dev]'` (or run scripts/setup.sh)") from e
    from importlib.metadata import version

    have = version("grpcio-tools")
    if have != GRPCIO_TOOLS:
        raise ProtogenError(f"grpcio-tools {have} is installed; the stubs are generated with {GRPCIO_TOOLS} "
                            f"(protobuf {STUB_PROTOBUF} gencode): `pip install grpcio-tools=={GRPCIO_TOOLS}`")
    return protoc, Path(grpc_tools.__file__).parent / "_proto"


def generate(out: Path = HERE) -> tuple[Path, ...]:
    """Write the three generated modules into `out` (the package folder by default)."""
    protoc, include = _protoc()
    rc = protoc.main([
        "grpc_tools.protoc", f"-I{HERE}", f"-I{include}", f"--python_out={out}", f"--pyi_out={out}",
        f"--grpc_python_out={out}", str(PROTO),
    ])
    if rc != 0:
        raise ProtogenError(f"protoc failed on {PROTO} (exit {rc})")
    grpc_py = out / "decision_pb2_grpc.py"
    text = grpc_py.read_text()
    grpc_py.write_text(re.sub(r"^import decision_pb2 as", "from policyc.server import decision_pb2 as", text, flags=re.MULTILINE))
    return tuple(out / n for n in NAMES)


def stale() -> list[str]:
    """The committed modules that differ from what the pinned protoc writes now (or are missing)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        return [p.name for p, q in zip(fresh, OUTPUTS) if not q.exists() or q.read_bytes() != p.read_bytes()]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        if args == ["--check"]:
            bad = stale()
            for name in bad:
                print(f"policyc protogen: server/{name} is stale: run `python -m policyc.server.protogen` and commit it",
                      file=sys.stderr)
            return 1 if bad else 0
        if args:
            print("usage: python -m policyc.server.protogen [--check]", file=sys.stderr)
            return 2
        for p in generate():
            print(f"generated {p.relative_to(HERE.parent)}")
    except ProtogenError as e:
        print(f"policyc protogen: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
