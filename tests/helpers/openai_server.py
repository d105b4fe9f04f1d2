"""A loopback HTTP server speaking the OpenAI chat-completions format, for end-to-end LLM tests (no internet).

Each request to ``POST /v1/chat/completions`` takes the next scripted reply; when the script is exhausted the
last reply repeats. A reply is a string (the assistant message content) or a :class:`Reply` (status code, delay,
raw body, or OpenAI tool calls: ``Reply(tool_calls=[("check", {"config": {...}})])`` answers a
``message.tool_calls`` list with ``finish_reason: tool_calls``). Every request body and its headers are kept in
``server.requests``. A request with ``stream: true`` is answered as server-sent events (usage only when asked for). ``GET /v1/models`` lists ``models`` (name, context length) like vLLM / llama.cpp do.
A reply may also be a function of the request body returning a string or :class:`Reply` (a scripted agent
that reads the tool results it was sent, as :func:`ranking_agent`).

Example::

    with OpenAIServer(["[[ ## reasoning ## ]]\\n...\\n[[ ## completed ## ]]"]) as srv:
        lm = dspy.LM("openai/test", api_base=srv.url, api_key="x", engine="litellm")
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    content: str = ""
    status: int = 200
    delay_s: float = 0.0
    raw: str | None = None
    """a raw body to send instead of a chat.completion JSON"""
    tool_calls: list[tuple[str, Any]] | None = None
    """(function name, arguments) pairs; arguments that are a string are sent as written (malformed JSON)"""
    usage: tuple[int, int] = (100, 50)
    """prompt and completion tokens reported"""
    finish_reason: str | None = None
    chunk_delay_s: float = 0.0
    """with ``stream: true``: a pause after each event (a slow generation)"""


Responder = Callable[[dict[str, Any]], "str | Reply"]


def ranking_agent(k: int = 4) -> Responder:
    """A scripted agent: asks ``top_untried(k)``, then submits what that tool answered (the model-guided
    ranking), each with a rationale; a rank-mode request (no tools, a shortlist) gets the shortlist's first
    ``k`` in order; a one-shot request an empty list."""

    def respond(body: dict[str, Any]) -> str | Reply:
        messages = body.get("messages") or []
        results = [m for m in messages if m.get("role") == "tool"]
        if body.get("tools") is None:
            if "shortlist" in json.dumps(messages):  # rank mode: the shortlist's first k, in order
                picks = [{"pick": i, "rationale": f"shortlisted {i}"} for i in range(1, k + 1)]
                return json.dumps({"choices": picks, "reasoning": "the shortlist's order"})
            return json.dumps({"reasoning": "no tools", "candidates": []})
        if not results:
            return Reply(tool_calls=[("top_untried", {"k": k})])
        ranked = json.loads(results[-1]["content"])
        cands = [
            {
                **r["config"],
                "rationale": f"ranked {i + 1} by the corrected model ({r['expected']:.0f} expected)",
            }
            for i, r in enumerate(ranked if isinstance(ranked, list) else [])
        ]
        return Reply(tool_calls=[("submit", {"candidates": cands})])

    return respond


def _completion(
    cid: str, model: str, message: dict[str, Any], finish: str, usage: tuple[int, int]
) -> dict[str, Any]:
    """A ``chat.completion`` body of one choice."""
    prompt, completion = usage
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


class OpenAIServer:
    def __init__(
        self,
        replies: list[str | Reply | Responder],
        models: list[tuple[str, int | None]] | None = (("test-model", 4096),),  # type: ignore[assignment]
        tools: bool = True,
        api_key: str | None = None,
    ) -> None:
        self.api_key = api_key
        """when set, a request without ``Authorization: Bearer <api_key>`` is answered HTTP 401, the model list
        too (``vllm serve --api-key``; ``llama-server --api-key`` guards the completions)"""
        self.replies = [r if isinstance(r, Reply) or callable(r) else Reply(r) for r in replies]
        self.models = list(models) if models is not None else None
        self.streams_completed = 0
        self.streams_abandoned = 0
        """streamed answers the client closed before their end (a generation the server could stop)"""
        self.tools = tools
        """whether the server passes tools to its model: a tool-call probe (a request whose only tool is
        ``primus_tool_probe``) is answered with that call, or in prose when False (llama.cpp without
        ``--jinja``); probes are kept in ``probes``, not ``requests``"""
        self.probes: list[dict[str, Any]] = []
        self.gets: list[str] = []
        """paths of the GET requests (kept apart: ``requests`` holds the chat completions)"""
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def _send(self, status: int, payload: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout tests)
                    pass

            def _keep(self, body: bytes) -> int:
                """Record a chat request in ``requests``; their count."""
                with owner._lock:
                    owner.requests.append(
                        {"path": self.path, "headers": dict(self.headers), "body": body.decode()}
                    )
                    return len(owner.requests)

            def _refused(self) -> bool:
                if owner.api_key is None or self.headers.get("Authorization") == f"Bearer {owner.api_key}":
                    return False
                error = {"message": "Invalid API Key", "type": "authentication_error", "code": 401}
                self._send(401, json.dumps({"error": error}).encode())
                return True

            def do_GET(self) -> None:
                with owner._lock:
                    owner.gets.append(self.path)
                if self._refused():
                    return
                if owner.models is None or not self.path.rstrip("/").endswith("/v1/models"):
                    self._send(404, json.dumps({"error": {"message": "not found"}}).encode())
                    return
                data = [
                    {"id": name, "object": "model", **({"meta": {"n_ctx_train": ctx}} if ctx else {})}
                    for name, ctx in owner.models
                ]
                self._send(200, json.dumps({"object": "list", "data": data}).encode())

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)) or 0)
                if self._refused():
                    self._keep(body)
                    return
                if self._probe(json.loads(body or b"{}")):
                    return
                n = self._keep(body)
                reply = owner.replies[min(n - 1, len(owner.replies) - 1)]
                if callable(reply):
                    answer = reply(json.loads(body or b"{}"))
                    reply = answer if isinstance(answer, Reply) else Reply(answer)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if reply.raw is not None:
                    payload = reply.raw.encode()
                elif reply.status != 200:
                    payload = json.dumps(
                        {"error": {"message": "scripted failure", "type": "server_error"}}
                    ).encode()
                else:
                    req = json.loads(body or b"{}")
                    message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
                    finish = "stop"
                    if reply.tool_calls is not None:
                        message["tool_calls"] = [
                            {
                                "id": f"call_{len(owner.requests)}_{i}",
                                "type": "function",
                                "function": {
                                    "name": name,
                                    "arguments": args if isinstance(args, str) else json.dumps(args),
                                },
                            }
                            for i, (name, args) in enumerate(reply.tool_calls)
                        ]
                        finish = "tool_calls"
                    payload = json.dumps(
                        _completion(
                            f"chatcmpl-{len(owner.requests)}",
                            req.get("model", "test"),
                            message,
                            reply.finish_reason or finish,
                            reply.usage,
                        )
                    ).encode()
                req = json.loads(body or b"{}")
                if reply.status == 200 and reply.raw is None and req.get("stream"):
                    usage = bool((req.get("stream_options") or {}).get("include_usage"))
                    self._stream(json.loads(payload), reply.chunk_delay_s, usage)
                    return
                self._send(reply.status, payload)

            def _probe(self, req: dict[str, Any]) -> bool:
                names = [t.get("function", {}).get("name") for t in req.get("tools") or []]
                if names != ["primus_tool_probe"]:
                    return False
                with owner._lock:
                    owner.probes.append(req)
                message: dict[str, Any] = {"role": "assistant", "content": "ok"}
                if owner.tools:
                    call = {"name": "primus_tool_probe", "arguments": '{"ok": true}'}
                    message = {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"id": "p", "type": "function", "function": call}],
                    }
                finish = "tool_calls" if owner.tools else "stop"
                payload = _completion("chatcmpl-probe", req.get("model", "test"), message, finish, (20, 5))
                self._send(200, json.dumps(payload).encode())
                return True

            def _stream(self, completion: dict[str, Any], delay_s: float, usage: bool) -> None:
                """The completion as server-sent events (``stream: true``): 16 characters per chunk, each
                tool call in one delta, usage in a last chunk only when ``stream_options.include_usage`` asks
                for it (as OpenAI, llama.cpp and vLLM do); a client that goes away stops it."""
                choice = completion["choices"][0]
                msg = choice["message"]
                base = {k: completion[k] for k in ("id", "created", "model")} | {
                    "object": "chat.completion.chunk"
                }

                def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
                    chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
                    return f"data: {json.dumps(chunk)}\n\n".encode()

                events = [event({"role": "assistant", "content": ""})]
                text = msg.get("content") or ""
                events += [event({"content": text[i : i + 16]}) for i in range(0, len(text), 16)]
                for i, call in enumerate(msg.get("tool_calls") or []):
                    events.append(event({"tool_calls": [{"index": i, **call}]}))
                events.append(event({}, choice["finish_reason"]))
                if usage:
                    last = {**base, "choices": [], "usage": completion["usage"]}
                    events.append(f"data: {json.dumps(last)}\n\n".encode())
                events.append(b"data: [DONE]\n\n")
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.end_headers()
                    for e in events:
                        self.wfile.write(e)
                        self.wfile.flush()
                        if delay_s:
                            time.sleep(delay_s)
                    with owner._lock:
                        owner.streams_completed += 1
                except (BrokenPipeError, ConnectionResetError):  # the client abandoned the request
                    with owner._lock:
                        owner.streams_abandoned += 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> OpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
