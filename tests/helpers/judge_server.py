"""A real local HTTP server speaking the OpenAI chat-completions protocol, with scripted answers and faults.

Shared by the judge client tests and the end-to-end reward runs.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# A scripted action: ("ok", text) | ("status", code) | ("sleep", seconds, text) | ("malformed",) | ("drop",)
Action = tuple


class JudgeServer:
    """OpenAI-compatible judge: pops scripted actions in request order, then falls back to `default`."""

    def __init__(self, default: Callable[[dict], Action] = lambda body: ("ok", "Judgement: 1")):
        self.script: list[Action] = []
        self.default = default
        self.chat_requests: list[dict] = []
        self.api_keys: list[str] = []
        """The Authorization header of each chat request, in order."""
        self.model_requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True)
        self.thread.start()
        self.closed = False

    def stop(self) -> None:
        if not self.closed:
            self.closed = True
            self.httpd.shutdown()
            self.httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: bytes) -> None:
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self) -> None:
                assert self.path == "/v1/models", self.path
                with server.lock:
                    server.model_requests += 1
                models = [{"id": "judge-72b", "object": "model", "created": 0, "owned_by": "test"}]
                self._send(200, json.dumps({"object": "list", "data": models}).encode())

            def do_POST(self) -> None:
                assert self.path == "/v1/chat/completions", self.path
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.chat_requests.append(body)
                    server.api_keys.append(self.headers.get("Authorization", ""))
                    action = server.script.pop(0) if server.script else server.default(body)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    self._act(action, body)
                finally:
                    with server.lock:
                        server.in_flight -= 1

            def _act(self, action: Action, body: dict) -> None:
                kind = action[0]
                if kind == "status":
                    self._send(
                        action[1], json.dumps({"error": {"message": "boom", "type": "server"}}).encode()
                    )
                elif kind == "malformed":
                    self._send(200, b'{"id": "x", "choices": [{"message": ')
                elif kind == "drop":
                    server.stop_soon()
                    self.close_connection = True
                else:
                    if kind == "sleep":
                        time.sleep(action[1])
                    self._send(200, json.dumps(completion(body["model"], action[-1])).encode())

        return Handler

    def stop_soon(self) -> None:
        """Shut the server down from inside a request (the endpoint goes away mid-run)."""
        self.closed = True
        self.httpd.server_close()  # no new connections from now on
        threading.Thread(target=self.httpd.shutdown, daemon=True).start()


def completion(model: str, text: str) -> dict:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
    }
