"""A small OpenAI-compatible HTTP/1.1 server for the gateway's LLM tests: a real process on
a real socket speaking what vLLM's server speaks (chat and completions, with and without
`stream`, server-sent events in chunked encoding with the headers sent before the first
token, `usage`, `/v1/models`), with timing the tests control per request:

- `x-policyc-fake-ttft-ms`: wait this long before the first token (default 0);
- `x-policyc-fake-gap-ms`: between tokens (default 2);
- `x-policyc-fake-stall-after`: after this many tokens, wait `x-policyc-fake-stall-ms`.

A server started with `--stalls` obeys them (the primaries); one without serves at the
default pace whatever the headers say (the backup a broken request is retried on).

A prompt's tokens are its whitespace-separated words; the answer is `max_tokens` tokens (16
when not given). `GET /fake/stats` says what it received and how many streams the client
left before their end (a disconnect stops generation, as vLLM's does).

Run: `python fake_openai.py PORT INSTANCE_ID [--stalls] MODEL...`; prints `ready` once listening.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

STATS: dict[str, Any] = {"requests": [], "cancelled": 0, "completed": 0}
STALLS = {"on": False}


def _words(body: dict[str, Any]) -> int:
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) for m in body["messages"])
    p = body.get("prompt", "")
    return sum(len(x.split()) for x in p) if isinstance(p, list) else len(str(p).split())


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes] | None:
    line = await reader.readline()
    if not line:
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        h = await reader.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    body = b""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                await reader.readline()
                break
            body += await reader.readexactly(size)
            await reader.readline()
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    return method, path, headers, body


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _answer(writer: asyncio.StreamWriter, method: str, path: str, headers: dict[str, str], raw: bytes,
                  instance: str, models: list[str]) -> None:
    base = {"x-policyc-instance": instance}
    if path == "/fake/stats":
        data = json.dumps(STATS).encode()
        writer.write(_head(200, {**base, "content-type": "application/json", "content-length": str(len(data))}) + data)
        return
    if path == "/v1/models":
        data = json.dumps({"object": "list", "data": [{"id": m, "object": "model"} for m in models]}).encode()
        writer.write(_head(200, {**base, "content-type": "application/json", "content-length": str(len(data))}) + data)
        return
    body = json.loads(raw)
    STATS["requests"].append({"path": path, "body": body, "headers": headers, "at": time.time()})
    control = headers if STALLS["on"] else {}
    ttft = float(control.get("x-policyc-fake-ttft-ms", "0")) / 1e3
    gap = float(control.get("x-policyc-fake-gap-ms", "2")) / 1e3
    stall_after = int(control.get("x-policyc-fake-stall-after", "-1"))
    stall = float(control.get("x-policyc-fake-stall-ms", "0")) / 1e3
    n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
    usage = {"prompt_tokens": _words(body), "completion_tokens": n, "total_tokens": _words(body) + n}
    chat = path == "/v1/chat/completions"
    rid = f"cmpl-{instance}-{len(STATS['requests'])}"

    def piece(i: int) -> dict[str, Any]:
        text = f" tok{i}"
        choice: dict[str, Any] = {"index": 0, "finish_reason": None}
        if chat:
            choice["delta"] = {"content": text} if i else {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "model": body["model"],
                "created": int(time.time()), "choices": [choice]}

    if not body.get("stream"):
        await asyncio.sleep(ttft + gap * max(n - 1, 0))
        text = "".join(f" tok{i}" for i in range(n))
        choice = {"index": 0, "finish_reason": "length",
                  **({"message": {"role": "assistant", "content": text}} if chat else {"text": text})}
        data = json.dumps({"id": rid, "object": "chat.completion" if chat else "text_completion", "model": body["model"],
                           "choices": [choice], "usage": usage}).encode()
        writer.write(_head(200, {**base, "content-type": "application/json", "content-length": str(len(data))}) + data)
        STATS["completed"] += 1
        return
    writer.write(_head(200, {**base, "content-type": "text/event-stream", "transfer-encoding": "chunked"}))
    await writer.drain()

    async def event(obj: Any) -> None:
        data = (f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n").encode()
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await writer.drain()

    try:
        await asyncio.sleep(ttft)
        for i in range(n):
            if i:
                await asyncio.sleep(stall if i == stall_after else gap)
            await event(piece(i))
        if (body.get("stream_options") or {}).get("include_usage"):
            await event({"id": rid, "object": "chat.completion.chunk", "model": body["model"], "choices": [], "usage": usage})
        await event("[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        STATS["completed"] += 1
    except (ConnectionError, OSError):
        STATS["cancelled"] += 1
        raise


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, instance: str, models: list[str]) -> None:
    try:
        while True:
            req = await _read_request(reader)
            if req is None:
                return
            await _answer(writer, *req, instance, models)
            await writer.drain()
    except (ConnectionError, OSError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()


async def main(port: int, instance: str, models: list[str]) -> None:
    server = await asyncio.start_server(lambda r, w: _serve(r, w, instance, models), "127.0.0.1", port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    rest = sys.argv[3:]
    if rest and rest[0] == "--stalls":
        STALLS["on"], rest = True, rest[1:]
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], rest))
