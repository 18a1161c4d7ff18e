"""How large and how deep any input may be, in one place.

Standard library only, beside the other leaves every stage shares (`diagnostic`, `meaning`):
the parser, the compiler, the bundle loader, the ONNX gate and the decision service all read it.

Every front door (policy source, bundle files and bytes, ONNX models, gRPC fields) is
bounded, so that hostile or careless input gets a clear error instead of gigabytes of
memory, a RecursionError or a hang. The figures are far above anything a real policy
set needs (the largest bundle measured, 10,000 contracts, is 35 MB of indented JSON; the
deepest real expression is 4 levels) and low enough that each input class stays within
the memory bound `tests/adversarial/README.md` states for it.
"""

from __future__ import annotations

# files
MAX_SOURCE_BYTES = 8 * 1024 * 1024  # one `.contract` file
MAX_BUNDLE_BYTES = 128 * 1024 * 1024  # one bundle (file, ReloadBundle bytes)
MAX_KEY_BYTES = 64 * 1024  # a PEM key file
MAX_TEST_FILE_BYTES = 8 * 1024 * 1024  # a `policyc test` TOML file
MAX_ONNX_BYTES = 2 * 1024 * 1024 * 1024  # protobuf's own ceiling for one message

# policy source
MAX_DEPTH = 64  # nesting of values: `not`, parentheses, lists, `and` inside `or` ...
MAX_TERMS = 1024  # operands of one `and` / `or`, items of one list
MAX_STRING_CHARS = 64 * 1024  # one string literal
MAX_NUMBER_CHARS = 64  # one number as written (a 38-digit count is a mistake, 5,000 digits an attack)
MAX_TOKENS = 100_000_000  # a contract's token count

# bundle JSON
MAX_JSON_DEPTH = 2 * MAX_DEPTH + 32  # expressions nest two JSON levels per IR level, plus the frame

# versions (`cuda: >= 12.1`)
MAX_VERSION_PARTS = 4
