"""Running Python on a SandboxFusion server (bytedance/SandboxFusion) instead of the local sandbox.

`run_python_fusion` posts the program to the server's `POST /run_code` and returns the same
`SandboxResult` as the local `run_python` (`rewards/sandbox/`), so the code reward can use either;
`make_runner` picks one of the two by name.

The protocol (SandboxFusion `sandbox/server/sandbox_api.py` and `sandbox/runners/types.py`):

- request `RunCodeRequest`: `code`, `language` (`"python"`), `stdin`, `run_timeout` (seconds),
  `memory_limit_MB`, `files` (path -> base64 content); `compile_timeout` and `fetch_files` are not
  sent (Python has no compile step; no files are fetched back).
- response `RunCodeResponse`: `status` (`Success`, `Failed`, `SandboxError`), `message`,
  `compile_result`, `run_result`, each a `CommandRunResult`: `status` (`Finished`, `Error`,
  `TimeLimitExceeded`), `execution_time`, `return_code`, `stdout`, `stderr`.

How it departs from the local sandbox:

- Limits. `wall_s` becomes `run_timeout` and `memory_mb` becomes `memory_limit_MB`; `cpu_s`,
  `file_size_mb` and `max_processes` have no counterpart in the protocol and are left to the server.
  `max_output_bytes` is applied here, after the run: either stream over it gives `output_limit` (the
  local sandbox stops the program at that point; the server lets it run to the end).
- Statuses. A `run_result` with status `Error` is the server failing to start the program (the
  server then answers `SandboxError`), not the program failing, so it is `sandbox_error`. A program
  that raised is `Finished` with a nonzero `return_code`: `runtime_error`, or `memory_limit` when the
  last stderr line is a MemoryError (the server's RLIMIT_AS). A program killed by SIGKILL (return
  code -9, or 137 through the server's `bash -c` wrapper) was killed by the server's memory cgroup,
  since the server reports its own timeouts as `TimeLimitExceeded`: `memory_limit`.
- `exit_code` is None after `TimeLimitExceeded` (the server does not report one); `wall_s` is the
  time seen by this client, the request included; `network` is `remote` and `uid` None.
- Transport. Connection errors, timeouts and HTTP 5xx / 429 are retried with exponential backoff and
  full jitter, up to `max_attempts` requests in all; other HTTP errors, a malformed response and a
  `SandboxError` answer are not. What cannot be retried away is a `sandbox_error` naming the URL.
"""

from __future__ import annotations

import base64
import functools
import http.client
import json
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from rlstack.rewards.sandbox import DEFAULT_LIMITS, SandboxLimits, SandboxResult, run_python
from rlstack.rewards.sandbox.limits import _classify

Runner = Callable[[str, str, SandboxLimits], SandboxResult]
"""(code, stdin, limits) -> result: what the code reward calls to run one test."""

_REQUEST_MARGIN_S = 60.0
_MAX_BACKOFF_S = 30.0
_MAX_MESSAGE_CHARS = 500
_KILLED = (-9, 137)  # SIGKILL, directly or through `bash -c` (128 + 9)


def run_python_fusion(
    url: str,
    code: str,
    stdin: str = "",
    limits: SandboxLimits = DEFAULT_LIMITS,
    files: dict[str, bytes] | None = None,
    request_timeout_s: float | None = None,
    max_attempts: int = 3,
    backoff_s: float = 1.0,
) -> SandboxResult:
    """Run `code` on the SandboxFusion server at `url` and return what happened (see module docstring).

    `url` is the server's base address (`http://host:8080`) or its `/run_code` endpoint.
    `request_timeout_s` bounds each HTTP request (default: `limits.wall_s` plus a minute for the
    server's queue); before retry `k` (1-based) the client sleeps a random time up to
    `backoff_s * 2**(k-1)` seconds (at most 30).
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1 (the first request counts), got {max_attempts}")
    start = time.monotonic()
    base = url.rstrip("/")
    endpoint = base if base.endswith("/run_code") else base + "/run_code"
    request = {
        "code": code,
        "language": "python",
        "stdin": stdin,
        "run_timeout": limits.wall_s,
        "memory_limit_MB": limits.memory_mb,
        "files": {name: base64.b64encode(data).decode("ascii") for name, data in (files or {}).items()},
    }
    timeout = request_timeout_s if request_timeout_s is not None else limits.wall_s + _REQUEST_MARGIN_S
    body, why = _post(endpoint, json.dumps(request).encode(), timeout, max_attempts, backoff_s)
    if body is None:
        return _failed(f"SandboxFusion at {endpoint}: {why}", start)
    try:
        response = json.loads(body)
        if not isinstance(response, dict):
            raise ValueError(f"expected a JSON object, got {type(response).__name__}")
    except ValueError as e:
        return _failed(f"SandboxFusion at {endpoint}: malformed response ({e}): {_shorten(body)!r}", start)
    return _to_result(response, endpoint, limits, start)


def make_runner(backend: str, url: str | None) -> Runner:
    """The local sandbox (`local`) or the SandboxFusion server at `url` (`fusion`), as a `Runner`."""
    if backend == "local":
        return run_python
    if backend == "fusion":
        if not url:
            raise ValueError(
                "worker.reward.code.sandbox='fusion' needs worker.reward.code.sandbox_url, the address of "
                "a running SandboxFusion server (e.g. http://localhost:8080); set it, or use sandbox='local'"
            )
        return functools.partial(run_python_fusion, url)
    raise ValueError(f"worker.reward.code.sandbox must be 'local' or 'fusion', got {backend!r}")


def _post(
    endpoint: str, data: bytes, timeout: float, max_attempts: int, backoff_s: float
) -> tuple[bytes | None, str]:
    """POST `data` as JSON, retrying transient failures: (body, "") or (None, what went wrong)."""
    why = ""
    for attempt in range(1, max_attempts + 1):
        if attempt > 1:
            time.sleep(random.uniform(0, min(_MAX_BACKOFF_S, backoff_s * 2 ** (attempt - 2))))
        req = urllib.request.Request(
            endpoint, data=data, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.read(), ""
        except urllib.error.HTTPError as e:
            try:
                detail = _shorten(e.read())
            except (OSError, http.client.HTTPException):
                detail = ""
            why = f"HTTP {e.code} {e.reason}" + (f": {detail}" if detail else "")
            if e.code != 429 and e.code < 500:
                return None, why
        except urllib.error.URLError as e:
            why = f"connection failed: {e.reason}"
        except (OSError, http.client.HTTPException) as e:
            why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return None, f"{why} (after {max_attempts} attempts)"


def _to_result(response: dict[str, Any], endpoint: str, limits: SandboxLimits, start: float) -> SandboxResult:
    run = response.get("run_result")
    if response.get("status") == "SandboxError" or (isinstance(run, dict) and run.get("status") == "Error"):
        message = response.get("message") or (run or {}).get("stderr") or "no message"
        return _failed(f"SandboxFusion at {endpoint}: SandboxError: {_shorten(message)}", start)
    if not isinstance(run, dict):
        return _failed(f"SandboxFusion at {endpoint}: response has no run_result: {response!r:.200}", start)
    out, out_over = _cap(run.get("stdout") or "", limits.max_output_bytes)
    err, err_over = _cap(run.get("stderr") or "", limits.max_output_bytes)
    code = run.get("return_code")
    if out_over or err_over:
        status, error_line = "output_limit", f"output over {limits.max_output_bytes} bytes"
    elif run.get("status") == "TimeLimitExceeded":
        status, error_line = "time_limit", f"run_timeout of {limits.wall_s:g}s exceeded on the server"
    elif run.get("status") != "Finished" or not isinstance(code, int):
        return _failed(f"SandboxFusion at {endpoint}: unexpected run_result: {run!r:.200}", start)
    elif code in _KILLED:
        status, error_line = "memory_limit", f"killed by SIGKILL on the server (exit status {code})"
    else:
        status, error_line = _classify(code, err, None, limits)
    return SandboxResult(
        status, code, out, err, error_line, time.monotonic() - start, "remote", None, "remote"
    )


def _cap(text: str, max_bytes: int) -> tuple[str, bool]:
    """`text` cut to `max_bytes` of UTF-8, and whether it was longer."""
    data = text.encode(errors="replace")
    if len(data) <= max_bytes:
        return text, False
    return data[:max_bytes].decode(errors="ignore"), True


def _shorten(text: str | bytes) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    text = " ".join(text.split())
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[: _MAX_MESSAGE_CHARS - 1] + "…"


def _failed(why: str, start: float) -> SandboxResult:
    return SandboxResult(
        "sandbox_error", None, "", "", why, time.monotonic() - start, "remote", None, "remote"
    )
