"""The commands in README.md and docs/ run as written, and their links lead somewhere.

README.md marks every shell block (a fence opened with ```bash) with an HTML comment on the line
before the fence, which GitHub does not render:

- `<!-- runnable -->`: cheap. Every line runs for real, in bash, from the repository root, with an
  `rlstack` on `PATH` that is this interpreter's (`python -m rlstack`), and must exit 0. The output is
  checked too: a `--print-config` line prints a config holding the values its overrides set,
  `rlstack config-keys` lists the keys, a training line's run directory has the step it stopped at.
- `<!-- runnable: server -->`: `rlstack board`, which serves until stopped: started on a free port,
  its page fetched, then stopped.
- `<!-- runnable: expensive -->`: too slow for a test, or needs what a test machine lacks (`make demo`,
  pip, a GPU, a cluster). Only parsed: `make X` must be a target of the Makefile, and each `rlstack
  train` / `rlstack sft` line must load as `--print-config` would load it (see the rules below).

Output directories are the only thing substituted when a command runs: `trainer.output_dir=TMP` is
appended to every `rlstack train` / `rlstack sft` line that trains (a later override wins), and an
argument starting with `outputs/` (the default `trainer.output_dir`) starts with `TMP/` instead.

docs/*.md are checked without running: every `rlstack train` / `rlstack sft` command, in a fenced
block or an inline code span (joined across line breaks), and every `--grpo-override` /
`--sft-override` of `rlstack demo` (against that demo's recipe in `rlstack/configs/`), loads with
`rlstack.config.load_config`, as `--print-config` loads it. The rules for loading a command that
needs what a test machine lacks:

- a `config=` (or `--config`) file named in `PLACEHOLDER_CONFIGS` (`my_run.yaml`: "your config";
  NeMo RL's `grpo_math_1B.yaml`) is replaced by the file it stands for; any other missing config fails;
- a problem about the environment is accepted: a model or data path that does not exist here (made by
  an earlier command, or yours), and what rlstack itself says this machine cannot run (a package that
  is not installed, no CUDA GPU, flash-attn: `--machine-checks=warn`). Any other problem (an unknown
  or renamed key, a bad value) fails the test.

Every relative link in README.md and docs/*.md must point at an existing file, and its `#anchor` at a
heading of that file (GitHub's slugs).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MARKS = ("runnable", "runnable: server", "runnable: expensive")
PLACEHOLDER_CONFIGS = {
    "my_run.yaml": "examples/grpo_addition.yaml",
    "grpo_math_1B.yaml": "tests/fixtures/nemo_rl/grpo_math_1B.yaml",  # NeMo RL's own file, as the fixture holds it
}
ENVIRONMENT_PROBLEMS = (
    re.compile(r"^[\w.]+: '[^']+' does not exist \(looked for "),
    re.compile(r"is not installed"),
    re.compile(r"NeMo RL's prompt file cannot be read \(No such file"),  # its examples/prompts/, not here
    re.compile(r"torch sees no CUDA GPU"),
)
DEMO_RECIPES = {
    "addition": ("demo_sft.yaml", "demo_grpo.yaml"),
    "code": ("demo_code_sft.yaml", "demo_code_grpo.yaml"),
    "visual": ("demo_visual_sft.yaml", "demo_visual_grpo.yaml"),
    "real": (None, "demo_real_grpo.yaml"),
}


@dataclass
class Block:
    mark: str | None
    lang: str
    lines: list[str]
    """The block's commands, continuation lines joined."""
    where: str


def fenced_blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, with the `<!-- ... -->` mark on the line before it."""
    text = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(text):
        m = re.match(r"^(`{3,})(\S*)", text[i])
        if not m:
            i += 1
            continue
        prev = text[i - 1].strip() if i else ""
        mark = re.fullmatch(r"<!--\s*(.*?)\s*-->", prev)
        j = i + 1
        while j < len(text) and not text[j].startswith(m.group(1)):
            j += 1
        blocks.append(
            Block(mark.group(1) if mark else None, m.group(2), _join(text[i + 1 : j]), f"{path.name}:{i + 1}")
        )
        i = j + 1
    return blocks


def _join(lines: list[str]) -> list[str]:
    """Lines with their `\\` continuations joined, blank lines dropped."""
    out, cur = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        if cur.strip():
            out.append(cur.strip())
        cur = ""
    return out


def words(line: str) -> list[str]:
    """The words of the first command of a shell line (up to a pipe, `;`, `&&` or a redirection)."""
    out = []
    for w in shlex.split(line, comments=True):
        if w in ("|", "||", "&&", ";") or w.startswith(">"):
            break
        out.append(w)
    return out


def rlstack_commands(line: str) -> list[str] | None:
    """The arguments after `rlstack` when the line runs it, else None."""
    w = words(line)
    return w[1:] if w[:1] == ["rlstack"] else None


def config_args(args: list[str]) -> list[tuple[str, list[str]]]:
    """(what, load_config arguments) for each config an `rlstack` command loads: train / sft lines, and
    the GRPO and warm-start overrides of `rlstack demo` with that demo's recipe."""
    if args[:1] in (["train"], ["sft"]):
        rest = args[1:]
        files = [
            f"config={rest[i + 1]}" for i, a in enumerate(rest[:-1]) if a == "--config"
        ]  # NeMo RL's form
        given = [
            a for i, a in enumerate(rest) if not a.startswith("--") and (i == 0 or rest[i - 1] != "--config")
        ]
        assert all("=" in a for a in given), f"not key=value: {given}"
        return [("", [_placeholder(a) for a in files + given])]
    if args[:1] == ["demo"]:
        out = []
        for flag, which in (("--grpo-override", 1), ("--sft-override", 0)):
            overrides = [args[i + 1] for i, a in enumerate(args) if a == flag]
            if overrides:
                task = args[args.index("--task") + 1] if "--task" in args else "addition"
                recipe = DEMO_RECIPES[task][which]
                assert recipe, f"the {task} demo has no {flag}"
                out.append((flag, [f"config=rlstack/configs/{recipe}", *overrides]))
        return out
    return []


def _placeholder(arg: str) -> str:
    key, _, value = arg.partition("=")
    if key == "config" and value in PLACEHOLDER_CONFIGS:
        return f"config={PLACEHOLDER_CONFIGS[value]}"
    return arg


def config_problems(args: list[str]) -> list[str]:
    """The problems loading `args` reports that are not about this machine's environment."""
    from rlstack.config import ConfigError, load_config

    try:  # what this machine cannot run (no GPU, a package not installed) is a warning, as rlstack says it
        load_config(args, machine_checks="warn")
    except ConfigError as e:
        return [p for p in e.problems if not any(r.search(p) for r in ENVIRONMENT_PROBLEMS)]
    return []


@pytest.fixture(scope="module")
def readme_blocks() -> list[Block]:
    return [b for b in fenced_blocks(README) if b.lang in ("bash", "sh")]


def test_every_readme_shell_block_is_marked(readme_blocks):
    """The self-check: the extractor finds the README's blocks, and none escapes the test unmarked."""
    unmarked = [b.where for b in readme_blocks if b.mark not in MARKS]
    assert not unmarked, f"shell blocks without <!-- runnable ... --> before their fence: {unmarked}"
    cheap = [line for b in readme_blocks if b.mark == "runnable" for line in b.lines]
    assert len(readme_blocks) >= 8 and len(cheap) >= 3, [b.where for b in readme_blocks]
    assert any("--print-config" in line for line in cheap)
    assert any(
        (rlstack_commands(line) or [""])[0] == "train" and "--print-config" not in line for line in cheap
    )
    assert sum(b.mark == "runnable: server" for b in readme_blocks) >= 1


def _substitute(line: str, tmp: Path) -> str:
    """Only the output directory: `outputs/...` arguments under tmp, and tmp as trainer.output_dir."""
    line = re.sub(r"(?<=[\s=])outputs/", f"{tmp}/", line)
    args = rlstack_commands(line)
    if args and args[0] in ("train", "sft") and "--print-config" not in args:
        command = line.split("#", 1)[0].rstrip()
        line = f"{command} trainer.output_dir={tmp}"
    return line


def _shim(tmp: Path) -> dict[str, str]:
    """An environment whose `rlstack` is this interpreter's."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "rlstack"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m rlstack "$@"\n')
    shim.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def _check_output(line: str, out: str) -> None:
    args = rlstack_commands(line) or []
    if "--print-config" in args:
        printed = yaml.safe_load(out)
        for a in args[1:]:
            key, _, value = a.partition("=")
            if key and value and key != "config" and not a.startswith("--"):
                node = printed
                for part in key.split("."):
                    node = node[part]
                assert str(node) == value, f"{line}: {key} printed as {node!r}"
        assert printed["worker"]["rollout"]["n"] >= 1
    elif args[:1] == ["config-keys"]:
        assert "worker.rollout.n" in out and "trainer.output_dir" in out
        assert len(out.splitlines()) > 100
    elif args[:1] == ["train"]:
        run_dir = Path(re.search(r"run directory: (\S+)", out).group(1))
        steps = [json.loads(r)["step"] for r in (run_dir / "metrics.jsonl").read_text().splitlines()]
        want = next(int(a.split("=")[1]) for a in args if a.startswith("trainer.max_steps="))
        assert max(steps) == want, f"{line}: steps {steps}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_and_fetch(line: str, env: dict[str, str]) -> None:
    """Start a board line on a free port, fetch its page, stop it."""
    command = f"exec {line.split('#', 1)[0].strip()} --port {_free_port()}"
    proc = subprocess.Popen(
        ["bash", "-c", command],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        first = proc.stdout.readline()
        m = re.search(r"on (http://\S+)", first)
        assert m, f"{line}: {first}{proc.stdout.read() if proc.poll() is not None else ''}"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(m.group(1), timeout=5) as r:
                    assert r.status == 200 and b"<html" in r.read().lower()
                break
            except OSError:
                assert time.monotonic() < deadline, f"{line}: {m.group(1)} never answered"
                time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_readme_runnable_blocks_run(readme_blocks, tmp_path):
    env = _shim(tmp_path)
    for block in readme_blocks:
        if block.mark not in ("runnable", "runnable: server"):
            continue
        for line in block.lines:
            line = _substitute(line, tmp_path)
            if block.mark == "runnable: server":
                _serve_and_fetch(line, env)
                continue
            done = subprocess.run(
                ["bash", "-o", "pipefail", "-c", line],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0, (
                f"{block.where}: {line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
            _check_output(line, done.stdout)


def test_readme_expensive_blocks_parse(readme_blocks):
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    checked = 0
    for block in readme_blocks:
        if block.mark != "runnable: expensive":
            continue
        for line in block.lines:
            w = words(line)
            if w[:1] == ["make"]:
                assert set(w[1:]) <= targets, f"{block.where}: {line}: no such make target"
                checked += 1
            for what, args in config_args(rlstack_commands(line) or []):
                assert not config_problems(args), f"{block.where}: {line} {what}: {config_problems(args)}"
                checked += 1
    assert checked >= 8


def _docs_commands() -> list[tuple[str, str]]:
    """(where, command) for every `rlstack` command in docs/: fenced block lines and inline code spans."""
    found = []
    for path in DOCS:
        for block in fenced_blocks(path):
            found += [(block.where, line) for line in block.lines if line.startswith("rlstack ")]
        prose = re.sub(r"^(`{3,}).*?^\1", "", path.read_text(), flags=re.M | re.S)
        for span in re.findall(r"`([^`]+)`", prose.replace("\n", " ")):
            if span.startswith(("rlstack train ", "rlstack sft ", "rlstack demo ")):
                found.append((path.name, span))
    return found


def test_docs_config_keys_exist():
    commands = _docs_commands()
    checked = 0
    for where, line in commands:
        for what, args in config_args(rlstack_commands(line) or []):
            problems = config_problems(args)
            assert not problems, f"{where}: {line} {what}: {problems}"
            checked += 1
    assert checked >= 15, commands


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose = re.sub(r"^(`{3,}).*?^\1", "", path.read_text(), flags=re.M | re.S)
    out, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", prose, re.M):
        s = slug(heading)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def test_relative_links_resolve():
    broken, count = [], 0
    for path in [README, *DOCS]:
        prose = re.sub(r"^(`{3,}).*?^\1", "", path.read_text(), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+:", target):
                continue
            count += 1
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{path.name}: {target} (no such file)")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                broken.append(f"{path.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
    assert count >= 50
