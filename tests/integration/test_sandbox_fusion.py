"""The SandboxFusion client against a real HTTP server that speaks SandboxFusion's `/run_code` protocol.

The fake server runs each posted program with rlstack's local `run_python` (stdin, `run_timeout` and
`memory_limit_MB` honoured) and answers as SandboxFusion's `sandbox/server/sandbox_api.py` does,
including its `parse_run_status`. It is stricter than the real one in one way: unknown request
fields are refused with 422 (pydantic would ignore them), so a misspelled field fails a test here
instead of being silently dropped by the server. Canned answers (HTTP errors, malformed bodies,
`SandboxError`) can be queued ahead of the real ones.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlstack.rewards.sandbox import SandboxLimits, run_python
from rlstack.rewards.sandbox_fusion import make_runner, run_python_fusion

LIMITS = SandboxLimits(wall_s=5.0, cpu_s=5.0, memory_mb=512)
REQUEST_FIELDS = {"code", "language", "stdin", "run_timeout", "compile_timeout", "memory_limit_MB"}
REQUEST_FIELDS |= {"files", "fetch_files"}


def _fusion_response(result) -> dict:
    """SandboxFusion's `RunCodeResponse` for what the local sandbox did."""
    if result.status == "sandbox_error":
        run = {"status": "Error", "stderr": result.error_line}
        return {"status": "SandboxError", "message": result.error_line, "run_result": run}
    run = {
        "status": "TimeLimitExceeded" if result.status == "time_limit" else "Finished",
        "execution_time": result.wall_s,
        "return_code": None if result.status == "time_limit" else result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
    }
    ok = run["status"] == "Finished" and run["return_code"] == 0
    return {"status": "Success" if ok else "Failed", "message": "", "run_result": run}


class _Handler(BaseHTTPRequestHandler):
    server: _FusionServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path != "/run_code":
            return self._send(404, b'{"detail":"Not Found"}')
        request = json.loads(body)
        self.server.requests.append(request)
        if self.server.canned:
            status, answer, delay_s = self.server.canned.pop(0)
            time.sleep(delay_s)
            return self._send(status, answer if isinstance(answer, bytes) else json.dumps(answer).encode())
        unknown = set(request) - REQUEST_FIELDS
        if unknown or "code" not in request or request.get("language") != "python":
            return self._send(
                422, json.dumps({"detail": f"bad request, unknown: {sorted(unknown)}"}).encode()
            )
        memory_mb = request.get("memory_limit_MB", -1)
        timeout = request.get("run_timeout", 10)
        limits = SandboxLimits(
            wall_s=timeout,
            cpu_s=timeout,
            memory_mb=memory_mb if memory_mb > 0 else 4096,
            max_output_bytes=1 << 24,  # SandboxFusion has no output limit of its own
        )
        files = {name: base64.b64decode(data) for name, data in request.get("files", {}).items()}
        result = run_python(request["code"], request.get("stdin") or "", limits, files)
        self._send(200, json.dumps(_fusion_response(result)).encode())

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args) -> None:
        pass


class _FusionServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.requests: list[dict] = []
        self.canned: list[tuple[int, bytes | dict, float]] = []
        """(HTTP status, body, delay in seconds) answered, in order, before any program is run."""

    def handle_error(self, request, client_address) -> None:
        pass  # a client that gave up on a delayed answer closed its socket; nothing to report


@pytest.fixture
def server():
    srv = _FusionServer()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join()


def _finished(return_code: int, stderr: str = "") -> dict:
    run = {
        "status": "Finished",
        "execution_time": 0.1,
        "return_code": return_code,
        "stdout": "",
        "stderr": stderr,
    }
    return {"status": "Failed", "message": "", "run_result": run}


def test_correct_program_is_ok(server):
    r = run_python_fusion(server.url, "print('hello')", limits=LIMITS)
    assert (r.status, r.exit_code, r.stdout, r.error_line) == ("ok", 0, "hello\n", "")
    assert (r.network, r.uid) == ("remote", None)
    request = server.requests[-1]
    assert request["language"] == "python"
    assert (request["run_timeout"], request["memory_limit_MB"]) == (LIMITS.wall_s, LIMITS.memory_mb)


def test_runtime_error_gives_last_traceback_line(server):
    code = "def f():\n    raise ValueError('bad input')\n\nf()\n"
    r = run_python_fusion(server.url, code, limits=LIMITS)
    assert (r.status, r.exit_code, r.error_line) == ("runtime_error", 1, "ValueError: bad input")
    assert "Traceback" in r.stderr


def test_infinite_loop_is_time_limit(server):
    start = time.monotonic()
    r = run_python_fusion(server.url, "while True:\n    pass\n", limits=LIMITS._replace(wall_s=1.0))
    assert (r.status, r.exit_code) == ("time_limit", None)
    assert "1s" in r.error_line
    assert time.monotonic() - start < 4


def test_stdin_is_passed_through(server):
    r = run_python_fusion(server.url, "print(int(input()) + int(input()))", "2\n3\n", LIMITS)
    assert (r.status, r.stdout) == ("ok", "5\n")


def test_files_are_delivered(server):
    code = "import json\nprint(open('data/in.bin', 'rb').read().hex(), json.load(open('cfg.json'))['k'])"
    files = {"data/in.bin": b"\x00\xffhi", "cfg.json": b'{"k": 7}'}
    r = run_python_fusion(server.url, code, limits=LIMITS, files=files)
    assert (r.status, r.stdout) == ("ok", "00ff6869 7\n")
    assert base64.b64decode(server.requests[-1]["files"]["data/in.bin"]) == b"\x00\xffhi"


def test_memory_error_is_memory_limit(server):
    r = run_python_fusion(server.url, "x = bytearray(1 << 30)", limits=LIMITS._replace(memory_mb=256))
    assert r.status == "memory_limit"
    assert r.error_line.startswith("MemoryError")


@pytest.mark.parametrize("return_code", [-9, 137])
def test_sigkill_from_the_server_is_memory_limit(server, return_code):
    server.canned.append((200, _finished(return_code), 0.0))
    r = run_python_fusion(server.url, "x = [0] * 10**10", limits=LIMITS)
    assert (r.status, r.exit_code) == ("memory_limit", return_code)


def test_output_is_capped_client_side(server):
    r = run_python_fusion(server.url, "print('x' * 5000)", limits=LIMITS._replace(max_output_bytes=1000))
    assert r.status == "output_limit"
    assert r.stdout == "x" * 1000


@pytest.mark.parametrize("http_status", [500, 503, 429])
def test_transient_http_error_is_retried(server, http_status):
    server.canned.append((http_status, b"Internal Server Error", 0.0))
    r = run_python_fusion(server.url, "print('hello')", limits=LIMITS, backoff_s=0.01)
    assert (r.status, r.stdout) == ("ok", "hello\n")
    assert len(server.requests) == 2


def test_client_error_is_not_retried(server):
    server.canned.append((422, {"detail": "field required: code"}, 0.0))
    r = run_python_fusion(server.url, "print('hello')", limits=LIMITS, backoff_s=0.01)
    assert r.status == "sandbox_error"
    assert "HTTP 422" in r.error_line and "field required: code" in r.error_line
    assert len(server.requests) == 1


def test_sandbox_error_answer_is_sandbox_error(server):
    answer = {"status": "SandboxError", "message": "exception on running code: no space left on device"}
    server.canned.append((200, {**answer, "compile_result": None, "run_result": None, "files": {}}, 0.0))
    r = run_python_fusion(server.url, "print('hello')", limits=LIMITS, backoff_s=0.01)
    assert (r.status, r.exit_code) == ("sandbox_error", None)
    assert "no space left on device" in r.error_line and server.url in r.error_line
    assert len(server.requests) == 1


def test_server_down_is_sandbox_error_after_max_attempts():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    start = time.monotonic()
    r = run_python_fusion(url, "print('hello')", limits=LIMITS, max_attempts=3, backoff_s=0.01)
    assert r.status == "sandbox_error"
    assert url in r.error_line and "after 3 attempts" in r.error_line
    assert time.monotonic() - start < 2


def test_request_timeout_is_retried_then_sandbox_error(server):
    server.canned += [(200, _finished(0), 1.0), (200, _finished(0), 1.0)]
    r = run_python_fusion(
        server.url, "print('hello')", limits=LIMITS, request_timeout_s=0.2, max_attempts=2, backoff_s=0.01
    )
    assert r.status == "sandbox_error"
    assert "timed out" in r.error_line and "after 2 attempts" in r.error_line
    assert len(server.requests) == 2


@pytest.mark.parametrize("body", [b"<html>Bad Gateway</html>", b"[1, 2]", b'{"status": "Success"}'])
def test_malformed_answer_is_sandbox_error(server, body):
    server.canned.append((200, body, 0.0))
    r = run_python_fusion(server.url, "print('hello')", limits=LIMITS)
    assert r.status == "sandbox_error"
    assert server.url in r.error_line
    assert len(server.requests) == 1


def test_make_runner(server):
    assert make_runner("local", None) is run_python
    runner = make_runner("fusion", server.url + "/run_code/")
    r = runner("print(input()[::-1])", "abc\n", LIMITS)
    assert (r.status, r.stdout, r.network) == ("ok", "cba\n", "remote")
    with pytest.raises(ValueError, match="sandbox_url"):
        make_runner("fusion", None)
    with pytest.raises(ValueError, match="'local' or 'fusion'"):
        make_runner("docker", "http://localhost:8080")
