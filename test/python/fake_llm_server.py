"""A scripted LLM server on 127.0.0.1 that speaks the Anthropic Messages API and the OpenAI chat
completions API, for testing the agents with the real SDKs (the only fake in the agent tests).

    with FakeLLMServer([anthropic_text("...```python ...```")]) as server:
        provider = get_provider("anthropic", base_url=server.url, api_key="test-key")
        ...
        assert server.received[0].body["system"][0]["cache_control"] == {"type": "ephemeral"}

Each request takes the next entry of the script: a `Reply`, or a callable `(Received) -> Reply`
(to answer from what was sent, e.g. a tool result). The server checks what the real APIs check
for the conversation's shape (auth header, roles, tool_use/tool_result pairing) and answers 400
or 401 like them when it is wrong. A `Reply` may also wait (`delay_s`, to outlast a client
timeout) or drop the connection without answering (`drop`).
"""
from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

_ids = itertools.count(1)


@dataclass
class Reply:
    body: Any = None
    status: int = 200
    headers: dict = field(default_factory=dict)
    delay_s: float = 0.0
    drop: bool = False


@dataclass
class Received:
    path: str
    headers: dict
    body: dict

    # Conveniences for assertions -----------------------------------------------------------
    def api_key(self) -> str | None:
        """The key the client sent, whichever header carried it."""
        auth = self.headers.get("authorization", "")
        return self.headers.get("x-api-key") or (auth[7:] if auth.startswith("Bearer ") else None)

    def all_text(self) -> str:
        """Every text the client sent: system, messages, tool results (either protocol)."""
        out = []
        system = self.body.get("system")
        if isinstance(system, str):
            out.append(system)
        elif isinstance(system, list):
            out += [b.get("text", "") for b in system]
        for m in self.body.get("messages", []):
            content = m.get("content")
            if isinstance(content, str):
                out.append(content)
            elif isinstance(content, list):
                for b in content:
                    if b.get("type") == "text":
                        out.append(b["text"])
                    elif b.get("type") == "tool_result":
                        c = b.get("content")
                        out.append(c if isinstance(c, str) else json.dumps(c))
        return "\n".join(out)

    def last_user_text(self) -> str:
        m = self.body["messages"][-1]
        content = m.get("content")
        if isinstance(content, str):
            return content
        return "\n".join(b.get("text", "") or str(b.get("content", "")) for b in content)


Script = "list[Reply | Callable[[Received], Reply]]"


class FakeLLMServer:
    def __init__(self, script: Script = (), require_key: bool = True) -> None:
        self.script = list(script)
        self.received: list[Received] = []
        self.require_key = require_key
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:   # keep test output clean
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"_raw": raw.decode(errors="replace")}
                received = Received(self.path, {k.lower(): v for k, v in self.headers.items()},
                                    body)
                reply = server._next(received)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if reply.drop:
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                data = json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for k, v in reply.headers.items():
                        self.send_header(k, str(v))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass       # the client gave up waiting (a hang test)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def add(self, *replies: "Reply | Callable[[Received], Reply]") -> None:
        with self._lock:
            self.script.extend(replies)

    def __enter__(self) -> "FakeLLMServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def remaining(self) -> int:
        return len(self.script)

    def _next(self, received: Received) -> Reply:
        with self._lock:
            self.received.append(received)
            problem = self._check(received)
            if problem is not None:
                return problem
            if not self.script:
                message = "fake server: script exhausted"
                return (anthropic_error(500, "api_error", message)
                        if received.path.endswith("/messages")
                        else openai_error(500, "server_error", message))
            entry = self.script.pop(0)
        return entry(received) if callable(entry) else entry

    # What the real APIs reject ---------------------------------------------------------------
    def _check(self, r: Received) -> Reply | None:
        if r.path.endswith("/messages"):
            return self._check_anthropic(r)
        if r.path.endswith("/chat/completions"):
            return self._check_openai(r)
        return Reply({"error": {"message": f"no route {r.path}"}}, status=404)

    def _check_anthropic(self, r: Received) -> Reply | None:
        # SDKs send the key as x-api-key (1.x) or as a bearer token (2.x).
        if self.require_key and not r.api_key():
            return anthropic_error(401, "authentication_error", "x-api-key header is required")
        if not r.headers.get("anthropic-version"):
            return anthropic_error(400, "invalid_request_error",
                                   "anthropic-version header is required")
        b = r.body
        for key in ("model", "max_tokens", "messages"):
            if key not in b:
                return anthropic_error(400, "invalid_request_error", f"{key}: Field required")
        breakpoints = 0
        for block in b.get("system", []) if isinstance(b.get("system"), list) else []:
            breakpoints += "cache_control" in block
        pending: set[str] = set()
        for i, m in enumerate(b["messages"]):
            want = "user" if i % 2 == 0 else "assistant"
            if m.get("role") != want:
                return anthropic_error(400, "invalid_request_error",
                                       f"messages.{i}: roles must alternate, starting with user")
            blocks = m["content"] if isinstance(m["content"], list) else [
                {"type": "text", "text": m["content"]}]
            if not blocks:
                return anthropic_error(400, "invalid_request_error",
                                       f"messages.{i}: content must be non-empty")
            results = {blk.get("tool_use_id") for blk in blocks if blk.get("type") == "tool_result"}
            if pending and results != pending:
                return anthropic_error(400, "invalid_request_error",
                                       f"messages.{i}: tool_use ids {sorted(pending)} need "
                                       "tool_result blocks in the next message")
            pending = {blk["id"] for blk in blocks if blk.get("type") == "tool_use"}
            for blk in blocks:
                breakpoints += "cache_control" in blk
                if blk.get("type") == "text" and not blk.get("text"):
                    return anthropic_error(400, "invalid_request_error",
                                           f"messages.{i}: text content blocks must be non-empty")
        if breakpoints > 4:
            return anthropic_error(400, "invalid_request_error",
                                   "A maximum of 4 blocks with cache_control may be provided")
        return None

    def _check_openai(self, r: Received) -> Reply | None:
        if self.require_key and not r.headers.get("authorization", "").startswith("Bearer "):
            return openai_error(401, "invalid_api_key", "You didn't provide an API key.")
        b = r.body
        if "model" not in b or "messages" not in b:
            return openai_error(400, "invalid_request_error", "model and messages are required")
        pending: set[str] = set()
        for i, m in enumerate(b["messages"]):
            if m.get("role") == "tool":
                pending.discard(m.get("tool_call_id"))
                continue
            if pending:
                return openai_error(400, "invalid_request_error",
                                    f"messages[{i}]: tool_calls {sorted(pending)} must be answered "
                                    "by tool messages first")
            if m.get("role") == "assistant":
                pending = {c["id"] for c in m.get("tool_calls") or ()}
        return None


# --- Anthropic answers --------------------------------------------------------------------

def anthropic_message(content: list[dict], stop_reason: str = "end_turn",
                      usage: dict | None = None, model: str = "claude-test") -> Reply:
    return Reply({"id": f"msg_{next(_ids):04d}", "type": "message", "role": "assistant",
                  "model": model, "content": content, "stop_reason": stop_reason,
                  "stop_sequence": None,
                  "usage": {"input_tokens": 1000, "output_tokens": 200,
                            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                            **(usage or {})}})


def anthropic_text(text: str, **kw: Any) -> Reply:
    return anthropic_message([{"type": "text", "text": text}], **kw)


def anthropic_tool_use(name: str, arguments: dict, text: str = "", **kw: Any) -> Reply:
    content = [{"type": "text", "text": text}] if text else []
    content.append({"type": "tool_use", "id": f"toolu_{next(_ids):04d}", "name": name,
                    "input": arguments})
    return anthropic_message(content, stop_reason="tool_use", **kw)


def anthropic_error(status: int, kind: str, message: str, headers: dict | None = None) -> Reply:
    return Reply({"type": "error", "error": {"type": kind, "message": message}},
                 status=status, headers=headers or {})


# --- OpenAI answers -----------------------------------------------------------------------

def openai_completion(text: str | None = None, tool_calls: list[tuple[str, dict]] = (),
                      usage: dict | None = None, finish_reason: str | None = None,
                      model: str = "gpt-test") -> Reply:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = [{"id": f"call_{next(_ids):04d}", "type": "function",
                                  "function": {"name": n, "arguments": json.dumps(a)}}
                                 for n, a in tool_calls]
    return Reply({"id": f"chatcmpl-{next(_ids)}", "object": "chat.completion",
                  "created": int(time.time()), "model": model,
                  "choices": [{"index": 0, "message": message, "finish_reason": finish_reason
                               or ("tool_calls" if tool_calls else "stop")}],
                  "usage": {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200,
                            **(usage or {})}})


def openai_error(status: int, code: str, message: str, headers: dict | None = None) -> Reply:
    return Reply({"error": {"message": message, "type": code, "param": None, "code": code}},
                 status=status, headers=headers or {})


def python_block(source: str, prose: str = "Here is the kernel.") -> str:
    return f"{prose}\n\n```python\n{source.strip()}\n```\n"


def tool_result_of(received: Received) -> str:
    """The content of the tool result(s) in the last message the client sent (either protocol)."""
    messages = received.body["messages"]
    if received.path.endswith("/messages"):
        return "\n".join(str(b.get("content")) for b in messages[-1]["content"]
                         if b.get("type") == "tool_result")
    out = []
    for m in reversed(messages):
        if m.get("role") != "tool":
            break
        out.append(m["content"])
    return "\n".join(reversed(out))
