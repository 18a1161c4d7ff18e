"""`policyc embed MODEL.onnx --contract FILE --name NAME -o OUT.onnx`: ship the contract inside the model.

FILE is a `.contract` source (compiled here) or a compiled bundle (`.json`). The contract
named NAME is stored, normalised, in the model's `metadata_props` with its sha256; other
metadata properties are kept. The output still passes `onnx.checker`. Exit 0 ok, 1 for a
contract that does not compile, an unknown NAME or a bad model, 2 for usage errors.
"""

from __future__ import annotations

import argparse
import json
import stat
import sys
from pathlib import Path

from policyc.compiler.bundle import Contract

from .exit_codes import Exit
from .help import add_command

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class _Failure(Exception):
    pass


def _contracts_from_source(path: Path) -> tuple[Contract, ...]:
    try:
        from policyc.compiler.pipeline import compile_paths
    except ImportError as e:  # the compiler is part of the same distribution; guard anyway
        raise _Failure(f"cannot compile `{path}`: the compiler is unavailable ({e})") from None
    result = compile_paths([path], analyse=False)  # the contract as written; solver bounds are not needed here
    errors = [d for d in result.diagnostics if getattr(d, "is_error", True)]
    if errors or result.bundle is None:
        try:
            from policyc.dsl.diagnostics import render_text

            text = render_text(errors, result.sources)
        except (ImportError, TypeError, AttributeError):
            text = "\n".join(str(d) for d in errors)
        raise _Failure(f"{path}: the contract does not compile:\n{text}")
    return result.bundle.contracts


def _contracts_from_bundle(path: Path) -> tuple[Contract, ...]:
    from policyc.compiler.bundle_io import BundleError, load

    try:
        return load(path).contracts
    except BundleError as e:
        raise _Failure(str(e)) from None


def select_contract(path: Path, name: str) -> Contract:
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: a NUL byte in the name
        shown = str(path).encode("unicode_escape").decode("ascii")
        raise _Failure(f"{shown}: no such contract file") from None
    except OSError as e:  # a parent the user cannot search
        raise _Failure(f"{path}: cannot read the contract file: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):  # a FIFO, a device, a directory: refused with its kind when read, never read here
        from policyc.compiler import bounded_read

        try:
            bounded_read.read_bytes(path, 0, "contract file")
        except bounded_read.FileRefused as e:
            raise _Failure(str(e)) from None
    contracts = _contracts_from_bundle(path) if path.suffix == ".json" else _contracts_from_source(path)
    for c in contracts:
        if c.name == name:
            return c
    have = ", ".join(f"`{c.name}`" for c in contracts) or "none"
    raise _Failure(f"{path}: no contract named `{name}` (contracts found: {have})")


def _read_stdin_model(read_model):  # type: ignore[no-untyped-def]
    """The model on stdin, read (and refused) as a file would be."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "stdin.onnx"
        path.write_bytes(sys.stdin.buffer.read())
        return read_model(str(path))


def run(args: argparse.Namespace) -> int:
    from .extras import require

    require("onnx", command="embed")
    import onnx

    from policyc.onnxgate.contract_metadata import CONTRACT_KEY, canonical_json, contract_hash, embed_contract
    from policyc.onnxgate.errors import ModelFileError
    from policyc.onnxgate.model_file import read_model

    try:
        contract = select_contract(Path(args.contract), args.name)
        model = read_model(args.model) if args.model != "-" else _read_stdin_model(read_model)
    except (_Failure, ModelFileError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAIL
    out = embed_contract(model, contract)
    try:
        onnx.checker.check_model(out)
    except onnx.checker.ValidationError as e:
        print(f"error: {args.model}: the model does not pass onnx.checker: {str(e).splitlines()[0]}", file=sys.stderr)
        return EXIT_FAIL
    try:
        if args.output == "-":
            sys.stdout.buffer.write(out.SerializeToString())
            sys.stdout.flush()
        else:
            Path(args.output).write_bytes(out.SerializeToString())
    except OSError as e:
        print(f"error: {args.output}: cannot write: {e.strerror}", file=sys.stderr)
        return EXIT_FAIL
    digest = contract_hash(canonical_json(contract))
    report = sys.stderr if args.output == "-" else sys.stdout
    if args.format == "json":
        print(json.dumps({"ok": True, "model": args.output, "contract": contract.name, "key": CONTRACT_KEY, "sha256": digest}, sort_keys=True), file=report)
    else:
        print(f"embedded contract `{contract.name}` {contract.version} into {args.output} ({digest})", file=report)
    return EXIT_OK


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "embed", help="store a contract in an ONNX model's metadata", description=__doc__.split("\n\n")[0],
                    codes=(Exit.OK, Exit.FAILED, Exit.USAGE),
                    examples=["policyc embed build/model.onnx --contract policies/fraud-scorer.contract --name fraud-scorer -o dist/model.onnx",
                              "policyc embed model.onnx --contract bundle.json --name fraud-scorer -o - > out.onnx"])
    p.add_argument("model", help="the ONNX model to read (`-`: stdin)")
    p.add_argument("--contract", required=True, metavar="FILE", help="a .contract source or a compiled bundle .json")
    p.add_argument("--name", required=True, help="the contract to embed")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="where to write the model with its contract (`-`: stdout)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output as text (default) or one JSON document")
    p.set_defaults(func=run)
