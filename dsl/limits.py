"""The input limits live in `policyc.compiler.limits` (the parser, the bundle loader, the
ONNX gate and the decision service all read them, and the runtime never imports `dsl/`);
this name stays for the parser's imports."""

from __future__ import annotations

from policyc.compiler.limits import *  # noqa: F401,F403
