"""One interpreter that imports KServe once and forks a model-server process per spec.

Importing KServe (pandas, FastAPI, the Kubernetes client…) is about a second of CPU, most
of a model server's start; a pool of N processes started from here pays it once. Each
child is a whole model server (`command.main(argv)`) with its own pid, log and ready file,
stoppable on its own; the zygote only forks, reaps and forwards SIGTERM/SIGINT.

    python -m policyc.modelserver.zygote SPEC.json

SPEC.json: `[{"argv": [...policyc.modelserver arguments...], "workdir": "DIR"}, ...]`.
For each child the zygote writes `DIR/pid` at once and `DIR/exit` (its exit status as
`os.waitstatus_to_exitcode` gives it) when it is reaped; its stdout and stderr go to
`DIR/server.log`. The zygote exits once every child has.

Children are forked before anything starts a thread or opens a socket (no gRPC channel or
server exists in the zygote), which is what makes forking here safe.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from types import FrameType


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


SIGNALS = {signal.SIGTERM, signal.SIGINT}


def _child(argv: list[str], workdir: Path) -> int:
    for sig in SIGNALS:  # the zygote's forwarding handler is not the child's
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
    fd = os.open(workdir / "server.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    from .command import main

    return main(argv)


def main(spec_path: str) -> int:
    specs = json.loads(Path(spec_path).read_text())
    argv0 = sys.argv
    sys.argv = argv0[:1]  # importing KServe parses sys.argv
    from . import onnx_model, serve  # noqa: F401 - the imports every child shares

    children: dict[int, Path] = {}
    stopping = False

    def forward(sig: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for spec in specs:
        if stopping:
            break
        workdir = Path(spec["workdir"])
        workdir.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)  # a signal now would reach the child's copy of `forward`
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(list(spec["argv"]), workdir)
            finally:
                os._exit(code)
        children[pid] = workdir
        _write(workdir / "pid", str(pid))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid in children:
            _write(children.pop(pid) / "exit", str(os.waitstatus_to_exitcode(status)))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m policyc.modelserver.zygote SPEC.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
