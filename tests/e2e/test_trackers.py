"""SwanLab and MLflow (offline, in the run directory) and Trackio (its local store, in a temporary
TRACKIO_DIR) receive a 2-step run's metrics, its config and the validation generations table (and
images where there are some), read back from what they wrote."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest
import yaml
from digits_run import digits_run
from PIL import Image

from rlstack.errors import RLStackError
from rlstack.tracking import (
    MlflowTracker,
    Progress,
    SwanlabTracker,
    TrackedRun,
    Tracker,
    TrackioTracker,
    WandbTracker,
    save_image_once,
)
from rlstack.trainer import Trainer


def swanlab_records(logdir: Path) -> list:
    """Every record SwanLab wrote (its own reader and protobuf messages)."""
    from swanlab.proto.swanlab.record.v1 import record_pb2
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (path,) = glob.glob(str(logdir / "run-*" / "run-*.swanlab"))
    reader = DataStoreReader()
    reader.open(path)
    records = []
    for data in reader:
        record = record_pb2.Record()
        record.ParseFromString(data)
        records.append(record)
    reader.close()
    return records


def wandb_records(run_dir: Path) -> list:
    """The records of the offline W&B run under `run_dir` (`run-*.wandb`: a header, then protobuf `Record`s in
    LevelDB's log format: 32 KiB blocks of checksum, length, type, data; a record may span blocks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    data, pos, block, chunks, records = Path(path).read_bytes(), 7, 32768, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        chunks += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, or the LAST piece of a record
            record = pb.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
    return records


def wandb_history(run_dir: Path) -> list[dict]:
    rows = []
    for r in wandb_records(run_dir):
        if r.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
    return rows


def mlflow_client(run_dir: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())


def tracked(run_dir: Path, config: dict, project: str, experiment: str) -> TrackedRun:
    """A one-step run from its start, for a tracker built on its own."""
    return TrackedRun(run_dir, config, project, experiment, 0, Progress(experiment, 1, 0))


JUDGE_KEY, ENV_KEY = "sk-judge-key-of-the-test", "wandb-key-of-the-test"


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    """A 2-step run with validation at both steps, logged to SwanLab and W&B (offline), MLflow (file store)
    and Trackio."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SWANLAB_MODE", "offline")
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        base = tmp_path_factory.mktemp("trackers")  # the run and every tracker's files
        mp.setenv("WANDB_DATA_DIR", str(base / "wandb_data"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.setenv("TRACKIO_DIR", str(base / "trackio"))  # read when trackio is imported
        cfg = digits_run(
            tiny_model_dir,
            base,
            "trackers",
            "data.val_files=builtin:addition@test",
            "data.val_max_samples=8",
            "trainer.val_freq=1",
            "trainer.val_before_train=false",
            "trainer.val_generations_to_log=4",
            "trainer.logger=[file,swanlab,mlflow,trackio,wandb]",
            f"worker.reward.judge.api_key={JUDGE_KEY}",  # secrets, which no file or tracker may hold
            f"trainer.env_vars={{WANDB_API_KEY: {ENV_KEY}, MY_FLAG: 'on'}}",
            steps=2,
        )
        Trainer(cfg).fit()
    metrics = {
        r["step"]: r for r in map(json.loads, (cfg.run_dir / "metrics.jsonl").read_text().splitlines())
    }
    return cfg, metrics


def test_swanlab_receives_the_metrics_config_and_generations(run):
    cfg, metrics = run
    records = swanlab_records(cfg.run_dir / "swanlog")
    scalars = {
        (r.scalar.key, r.scalar.step): r.scalar for r in records if r.WhichOneof("record_type") == "scalar"
    }
    for step in (1, 2):
        for key in ("critic/score/mean", "actor/pg_loss", "val/addition/accuracy"):
            assert (key, step) in scalars, key
    assert scalars[("critic/score/mean", 2)].value.number == pytest.approx(metrics[2]["critic/score/mean"])
    generations = [
        r.media
        for r in records
        if r.WhichOneof("record_type") == "media" and r.media.key == "val/generations"
    ]
    assert sorted(m.step for m in generations) == [1, 2]
    saved = [r.save for r in records if r.WhichOneof("record_type") == "save" and r.save.name == "config"]
    assert saved and "trainer" in Path(saved[0].source_path).read_text()


def test_mlflow_receives_the_metrics_config_and_generations(run):
    cfg, metrics = run
    client = mlflow_client(cfg.run_dir)
    experiment = client.get_experiment_by_name(cfg.trainer.project_name)
    (mlrun,) = client.search_runs([experiment.experiment_id])
    assert mlrun.info.run_name == cfg.trainer.experiment_name
    history = client.get_metric_history(mlrun.info.run_id, "critic/score/mean")
    assert [(m.step, m.value) for m in history] == [
        (s, pytest.approx(metrics[s]["critic/score/mean"])) for s in (1, 2)
    ]
    assert mlrun.data.params["trainer.max_steps"] == "2"
    table = client.download_artifacts(
        mlrun.info.run_id, "generations/val_step_2.json", str(cfg.run_dir / "dl")
    )
    data = json.loads(Path(table).read_text())
    assert data["columns"][:6] == ["step", "prompt", "response", "ground_truth", "score", "end_reason"]
    assert len(data["data"]) == 4


def test_wandb_offline_receives_the_metrics_config_and_generations(run):
    cfg, metrics = run
    history = wandb_history(cfg.run_dir)
    scores = [(h["_step"], h["critic/score/mean"]) for h in history if "critic/score/mean" in h]
    assert scores == [(s, pytest.approx(metrics[s]["critic/score/mean"])) for s in (1, 2)]
    tables = [h for h in history if "val/generations/path" in h]
    assert sorted(h["_step"] for h in tables) == [1, 2]
    (offline,) = (cfg.run_dir / "wandb").glob("offline-run-*")
    table = json.loads((offline / "files" / tables[-1]["val/generations/path"]).read_text())
    assert table["columns"][:6] == ["step", "prompt", "response", "ground_truth", "score", "end_reason"]
    assert len(table["data"]) == 4
    (run_record,) = [r.run for r in wandb_records(cfg.run_dir) if r.WhichOneof("record_type") == "run"]
    config = {u.key: json.loads(u.value_json) for u in run_record.config.update}
    assert config["trainer"]["max_steps"] == 2 and run_record.display_name == cfg.trainer.experiment_name


def test_trackio_receives_the_metrics_config_and_generations(run):
    from trackio.sqlite_storage import SQLiteStorage

    cfg, metrics = run
    logs = SQLiteStorage.get_logs(cfg.trainer.project_name, cfg.trainer.experiment_name)
    scores = [(r["step"], r["critic/score/mean"]) for r in logs if "critic/score/mean" in r]
    assert scores == [(s, pytest.approx(metrics[s]["critic/score/mean"])) for s in (1, 2)]
    tables = [r for r in logs if "val/generations" in r]
    assert sorted(r["step"] for r in tables) == [1, 2]
    assert len(tables[0]["val/generations"]["_value"]) == 4
    config = SQLiteStorage.get_run_config(cfg.trainer.project_name, cfg.trainer.experiment_name)
    assert config["trainer"]["max_steps"] == 2


def test_no_file_and_no_tracker_holds_a_secret(run):
    """config.yaml and every tracker's files and config show the judge's API key and a key in
    trainer.env_vars as ***, and the other values as they are."""
    from trackio.sqlite_storage import SQLiteStorage

    cfg, _ = run
    assert cfg.worker.reward.judge.api_key == JUDGE_KEY  # the run itself has it
    files = [p for p in Path(cfg.trainer.output_dir).rglob("*") if p.is_file()]
    assert len(files) > 20 and any(p.suffix == ".yaml" for p in files)
    for path in files:
        data = path.read_bytes()
        assert JUDGE_KEY.encode() not in data and ENV_KEY.encode() not in data, path
    saved = yaml.safe_load((cfg.run_dir / "config.yaml").read_text())
    assert saved["worker"]["reward"]["judge"]["api_key"] == "***"
    assert saved["trainer"]["env_vars"] == {"WANDB_API_KEY": "***", "MY_FLAG": "on"}
    config = SQLiteStorage.get_run_config(cfg.trainer.project_name, cfg.trainer.experiment_name)
    assert config["worker"]["reward"]["judge"]["api_key"] == "***"


def test_images_of_generations_reach_the_trackers(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("SWANLAB_MODE", "offline")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    picture = save_image_once(Image.new("RGB", (16, 8), (200, 30, 30)), tmp_path)
    rows = [
        {"step": 1, "prompt": "p", "response": "r", "ground_truth": "g", "score": 1.0, "end_reason": "done"}
        | {"images": [picture], "tool_images": []}
    ]
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb_data"))  # its staging, not ~/.local
    for cls in (SwanlabTracker, MlflowTracker, TrackioTracker, WandbTracker):
        tracker = cls(tracked(tmp_path, {"a": {"b": 1}}, "project", "images"))
        tracker.log({"x": 1.0}, 1)
        tracker.log_generations(rows, 1, tmp_path)
        tracker.close()
    media = [r.media for r in swanlab_records(tmp_path / "swanlog") if r.WhichOneof("record_type") == "media"]
    assert {m.key for m in media} == {"val/generations", "val/generation_images"}
    client = mlflow_client(tmp_path)
    (mlrun,) = client.search_runs([client.get_experiment_by_name("project").experiment_id])
    assert [a.path for a in client.list_artifacts(mlrun.info.run_id, "images")] == [
        f"images/{Path(picture).name}"
    ]
    # W&B keeps a table's images in the table's artifact (offline: staged under WANDB_DATA_DIR)
    (artifact,) = [r.artifact for r in wandb_records(tmp_path) if r.WhichOneof("record_type") == "artifact"]
    files = {c.path: Path(c.local_path) for c in artifact.manifest.contents}
    pngs = [p for p in files if p.startswith("media/images/") and p.endswith(".png")]
    assert len(pngs) == 1 and Image.open(files[pngs[0]]).size == (16, 8)
    (table,) = [json.loads(files[p].read_text()) for p in files if p.endswith(".table.json")]
    image = table["data"][0][table["columns"].index("image_0")]  # the image itself, one per cell
    assert image["_type"] == "image-file" and image["path"] == pngs[0]


def test_a_missing_tracker_package_is_a_clear_error(tmp_path: Path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_mlflow(name, *args, **kwargs):
        if name == "mlflow":
            raise ImportError("No module named 'mlflow'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mlflow)
    monkeypatch.setattr("importlib.import_module", lambda name: no_mlflow(name))
    with pytest.raises(RLStackError, match=r"pip install 'rlstack\[mlflow\]'"):
        Tracker(tmp_path, ["mlflow"], {}, "p", "e", total_steps=1)


def test_mlflow_takes_metric_names_it_would_refuse(tmp_path: Path, monkeypatch):
    """`val/<source>/pass@k` (and any name with characters MLflow refuses) reaches MLflow renamed, not as an error."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = MlflowTracker(tracked(tmp_path, {}, "project", "names"))
    tracker.log({"val/humaneval/pass@4": 0.25, "val/x/accuracy": 0.5, "weird{name}": 1.0}, 1)
    tracker.close()
    client = mlflow_client(tmp_path)
    (mlrun,) = client.search_runs([client.get_experiment_by_name("project").experiment_id])
    assert mlrun.data.metrics == {"val/humaneval/pass_at_4": 0.25, "val/x/accuracy": 0.5, "weird_name_": 1.0}


def test_wandb_takes_its_project_and_name_from_the_environment_where_the_config_leaves_the_defaults(
    tmp_path: Path, monkeypatch
):
    """As veRL and EasyR1 (and `wandb.init`'s own precedence): a project the config names wins over
    WANDB_PROJECT; at rlstack's default the variable names it. WANDB_RUN_GROUP is W&B's own, read too."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb_data"))
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    monkeypatch.setenv("WANDB_NAME", "run-from-env")
    monkeypatch.setenv("WANDB_RUN_GROUP", "group-from-env")
    import wandb

    wandb.teardown()  # W&B reads its variables once a process: again, as a run started with them would
    for name, project, experiment in (("defaults", "rlstack", "default"), ("named", "mine", "my-run")):
        tracker = WandbTracker(tracked(tmp_path / name, {"a": 1}, project, experiment))
        tracker.log({"x": 1.0}, 1)
        tracker.close()
    wandb.teardown()  # and not for the tests after this one
    runs = {
        name: next(r.run for r in wandb_records(tmp_path / name) if r.WhichOneof("record_type") == "run")
        for name in ("defaults", "named")
    }
    assert (runs["defaults"].project, runs["defaults"].display_name) == ("from-env", "run-from-env")
    assert (runs["named"].project, runs["named"].display_name) == ("mine", "my-run")
    assert runs["defaults"].run_group == runs["named"].run_group == "group-from-env"
