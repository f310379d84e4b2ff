"""`rlstack board RUN_DIR ...`: a local web page over run directories, live while they are written.

It reads what the trainer writes: `metrics.jsonl` (curves, runs overlaid), `generations/*.jsonl` (the
rollout browser: prompt, response, reward components, and for agent trajectories each turn with its
tool call, the tool's output and the images saved under `images/`) and `config.yaml`. The page
(`static/index.html`, `static/board.js`) draws the curves with Plotly.js, served from the `plotly`
package (nothing is fetched from the network), and polls the server every few seconds.

The server is the standard library's threaded HTTP server, bound to 127.0.0.1 by default; it serves
JSON under `/api/` and only the files of a run's `images/` folder.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import deque
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

from rlstack.errors import RLStackError

STATIC = Path(__file__).parent / "static"
GENERATIONS = re.compile(r"^(train|val)_step_(\d+)\.jsonl$")
IMAGE = re.compile(r"^[0-9a-f]{6,64}\.png$")


def plotly_js() -> Path:
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


RUN_MARKS = ("metrics.jsonl", "config.yaml", "generations")
"""What the trainer writes into a run directory first: a folder holding any of these is a run."""


def is_run_dir(d: Path) -> bool:
    return any((d / mark).exists() for mark in RUN_MARKS)


def find_runs(folder: Path) -> list[Path]:
    """The run directories at or below `folder`, in path order: `folder` itself when it is a run, else every
    folder under it that is one (not looking inside a run, nor into hidden folders)."""
    if is_run_dir(folder):
        return [folder]
    found = []
    for parent, subdirs, _ in os.walk(folder):
        here = Path(parent)
        if here != folder and is_run_dir(here):
            found.append(here)
            subdirs.clear()
            continue
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
    return sorted(found)


def check_run_dirs(paths: list[Path]) -> list[Path]:
    """The run directories: each path a run directory, or a folder with runs below it (`outputs/examples`)."""
    if not paths:
        raise RLStackError(
            "rlstack board needs at least one run directory (the folder with metrics.jsonl) or a folder of them"
        )
    checked: list[Path] = []
    for d in map(Path, paths):
        if not d.is_dir():
            raise RLStackError(
                f"{d} is not a directory: pass run directories (the folders with metrics.jsonl) or a folder of them"
            )
        runs = find_runs(d)
        if not runs:
            raise RLStackError(
                f"{d} holds neither metrics.jsonl nor generations/ nor config.yaml, and no folder below it does: "
                "pass a run directory, <trainer.output_dir>/<project_name>/<experiment_name>, or a folder above runs"
            )
        checked += [r.resolve() for r in runs if r.resolve() not in checked]
    return checked


def run_names(run_dirs: list[Path]) -> list[str]:
    """Short unique labels: the last path parts that tell the runs apart."""
    for depth in range(1, 6):
        names = ["/".join(d.parts[-depth:]) for d in run_dirs]
        if len(set(names)) == len(names):
            return names
    return [str(d) for d in run_dirs]


def read_jsonl(path: Path) -> list[dict]:
    """The complete lines of a JSON-lines file that may be being written (a partial last line is skipped)."""
    rows = []
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def generation_files(run_dir: Path) -> list[dict]:
    """`{"file", "kind", "step"}` of every generations file, by kind then step."""
    found = []
    for f in (run_dir / "generations").glob("*.jsonl"):
        m = GENERATIONS.match(f.name)
        if m:
            found.append({"file": f.name, "kind": m.group(1), "step": int(m.group(2))})
    return sorted(found, key=lambda g: (g["kind"], g["step"]))


class Board:
    """The run directories and the HTTP server over them (`serve` / `start`)."""

    def __init__(self, run_dirs: list[Path], host: str = "127.0.0.1", port: int = 6007):
        self.run_dirs = check_run_dirs(run_dirs)
        self.names = run_names(self.run_dirs)
        self.requests: deque[str] = deque(maxlen=1000)
        """The last paths served, in order (what a test checks the page asked for); bounded, as a live
        page polls for as long as it is open."""
        board = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (the standard library's name)
                board.requests.append(self.path)
                try:
                    status, kind, body = board.respond(urlparse(self.path).path)
                except Exception as e:  # a bad file must not take the board down
                    status, kind, body = HTTPStatus.INTERNAL_SERVER_ERROR, "text/plain", str(e).encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                # Plotly.js (4.8 MB) and a run's images never change; the page, its script and the API may
                static = self.path.startswith(("/static/plotly", "/run/"))
                self.send_header("Cache-Control", "max-age=3600" if static else "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        try:
            self.server = ThreadingHTTPServer((host, port), Handler)
        except OSError as e:
            raise RLStackError(
                f"rlstack board cannot listen on {host}:{port} ({e.strerror}): pass another --port"
            ) from e
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/"

    def respond(self, path: str) -> tuple[int, str, bytes]:
        parts = [unquote(p) for p in path.strip("/").split("/") if p]
        if not parts:
            return HTTPStatus.OK, "text/html; charset=utf-8", (STATIC / "index.html").read_bytes()
        if parts == ["static", "board.js"]:
            return HTTPStatus.OK, "text/javascript", (STATIC / "board.js").read_bytes()
        if parts == ["static", "plotly.min.js"]:
            return HTTPStatus.OK, "text/javascript", plotly_js().read_bytes()
        if parts == ["api", "runs"]:
            runs = [
                {"id": i, "name": n, "path": str(d)}
                for i, (n, d) in enumerate(zip(self.names, self.run_dirs))
            ]
            return _json(runs)
        prefix, rest = ("api", parts[2:]) if parts[:2] == ["api", "run"] else (parts[0], parts[1:])
        if (
            prefix in ("api", "run")
            and len(rest) >= 2
            and rest[0].isdigit()
            and int(rest[0]) < len(self.run_dirs)
        ):
            return self._run(prefix, self.run_dirs[int(rest[0])], rest[1:])
        return HTTPStatus.NOT_FOUND, "text/plain", f"no such page: {path}".encode()

    def _run(self, prefix: str, run_dir: Path, rest: list[str]) -> tuple[int, str, bytes]:
        if prefix == "api" and rest == ["metrics"]:
            return _json(read_jsonl(run_dir / "metrics.jsonl"))
        if prefix == "api" and rest == ["generations"]:
            return _json(generation_files(run_dir))
        if prefix == "api" and len(rest) == 2 and rest[0] == "generations" and GENERATIONS.match(rest[1]):
            return _json(read_jsonl(run_dir / "generations" / rest[1]))
        if prefix == "api" and rest == ["config"]:
            config = run_dir / "config.yaml"
            return (
                HTTPStatus.OK,
                "text/plain; charset=utf-8",
                config.read_bytes() if config.is_file() else b"",
            )
        if prefix == "run" and len(rest) == 2 and rest[0] == "images" and IMAGE.match(rest[1]):
            image = run_dir / "images" / rest[1]
            if image.is_file():
                return HTTPStatus.OK, "image/png", image.read_bytes()
        return HTTPStatus.NOT_FOUND, "text/plain", b"not found"

    def start(self) -> Board:
        """Serve in a background thread (tests, notebooks)."""
        self.thread = threading.Thread(target=self.server.serve_forever, name="rlstack-board", daemon=True)
        self.thread.start()
        return self

    def serve(self) -> None:
        """Serve until interrupted (Ctrl-C)."""
        try:
            self.server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            self.server.server_close()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _json(value) -> tuple[int, str, bytes]:
    return HTTPStatus.OK, "application/json", json.dumps(value, default=str).encode()
