"""A loopback HTTP server speaking the OpenAI chat-completions format, for end-to-end LLM tests (no internet).

Each request to ``POST /v1/chat/completions`` takes the next scripted reply; when the script is exhausted the
last reply repeats. A reply is a string (the assistant message content) or a :class:`Reply` (status code, delay,
raw body). Every request body and its headers are kept in ``server.requests``.

Example::

    with OpenAIServer(["[[ ## reasoning ## ]]\\n...\\n[[ ## completed ## ]]"]) as srv:
        lm = dspy.LM("openai/test", api_base=srv.url, api_key="x", engine="litellm")
"""

from __future__ import annotations

import json
import threading
import time
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


class OpenAIServer:
    def __init__(self, replies: list[str | Reply]) -> None:
        self.replies = [r if isinstance(r, Reply) else Reply(r) for r in replies]
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)) or 0)
                with owner._lock:
                    owner.requests.append(
                        {"path": self.path, "headers": dict(self.headers), "body": body.decode()}
                    )
                    idx = min(len(owner.requests) - 1, len(owner.replies) - 1)
                    reply = owner.replies[idx]
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
                    payload = json.dumps(
                        {
                            "id": f"chatcmpl-{len(owner.requests)}",
                            "object": "chat.completion",
                            "created": int(time.time()),
                            "model": req.get("model", "test"),
                            "choices": [
                                {
                                    "index": 0,
                                    "message": {"role": "assistant", "content": reply.content},
                                    "finish_reason": "stop",
                                }
                            ],
                            "usage": {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150},
                        }
                    ).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout tests)
                    pass

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
