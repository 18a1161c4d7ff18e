"""What one request tells the pick about itself beyond its shape: its prompt's leading blocks
(for prefix-cache affinity), its prompt tokens and its own TTFT SLO (for the predicted time
to first token).

Why a context variable: decisions share their prepared request, match and feasibility
answer per request *shape* (`server/request_shapes.py`: two prompts of the same token count
are one shape), so a fact that differs per request (which text the prompt opens with) cannot
ride on the shared request variables without defeating that cache. The gateway's LLM picker
(`gateway/llm_pick.py`) reads the body, sets `CURRENT` for the duration of its pick, and the
placer's picker (`pick.py`) reads it in the same task; a pick made anywhere else (the Decide
RPC, a test) sees None and the request-stage signals that need it add nothing.

The prompt's blocks: the prompt text (a chat's messages as role and content, in order; a
completion's prompt strings) cut into `BLOCK_CHARS`-character blocks, each hashed chained
with the one before it (block i's hash stands for the whole prefix up to it), at most
`MAX_BLOCKS` of them — the Gateway API Inference Extension's prefix-cache scorer does the
same on characters (its `hashBlockSize` 64), an approximation of the server's token blocks
that needs no tokenizer. Bounded: a 4 MB body hashes its first 16 KB of prompt only.
"""

from __future__ import annotations

import hashlib
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterable

BLOCK_CHARS = 64
MAX_BLOCKS = 256


@dataclass(frozen=True, slots=True)
class RequestFacts:
    prefix: tuple[int, ...]  # the chained hashes of the prompt's leading blocks (`prefix_blocks`)
    prompt_tokens: float  # the prompt's tokens, as the gateway counted them
    ttft_s: float | None = None  # the request's own TTFT SLO (`x-slo-ttft-ms`), seconds


CURRENT: ContextVar[RequestFacts | None] = ContextVar("policyc_request_facts", default=None)


def prefix_blocks(text: str, block_chars: int = BLOCK_CHARS, max_blocks: int = MAX_BLOCKS) -> tuple[int, ...]:
    """The chained hashes of `text`'s full leading blocks (a trailing partial block is left
    out: a server caches whole blocks only). Stable across processes (BLAKE2b, 8 bytes)."""
    if block_chars < 1 or max_blocks < 0:
        raise ValueError(f"prefix blocks: block_chars {block_chars!r} must be >= 1 and max_blocks {max_blocks!r} >= 0")
    data = text[:block_chars * max_blocks].encode("utf-8", "surrogatepass")
    out: list[int] = []
    prev = b""
    step = block_chars  # cut on characters' bytes: a block is the same bytes wherever it recurs
    for i in range(0, len(data) - step + 1, step):
        h = hashlib.blake2b(prev + data[i:i + step], digest_size=8).digest()
        out.append(int.from_bytes(h, "little"))
        prev = h
    return tuple(out)


def prompt_text(kind: str, body: dict[str, Any]) -> str:
    """The prompt as the blocks are cut from it: a chat's messages (role and content, text
    parts of a content list), a completion's prompt strings; token-id prompts give none."""
    parts: list[str] = []
    if kind == "chat":
        for m in body.get("messages") or ():
            if not isinstance(m, dict):
                continue
            parts.append(str(m.get("role", "")))
            parts.extend(_texts(m.get("content")))
    else:
        p = body.get("prompt")
        if isinstance(p, str):
            parts.append(p)
        elif isinstance(p, list) and all(isinstance(x, str) for x in p):
            parts.extend(p)
    return "\x1e".join(parts)


def _texts(content: object) -> Iterable[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for c in content:
            if isinstance(c, dict) and isinstance(c.get("text"), str):
                yield c["text"]


__all__ = ["BLOCK_CHARS", "CURRENT", "MAX_BLOCKS", "RequestFacts", "prefix_blocks", "prompt_text"]
