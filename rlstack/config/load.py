"""Loading: defaults <- `config=file.yaml` (with the files its `defaults` names) <- `a.b=c` overrides,
merged as plain dicts, OmegaConf interpolations (`${oc.env:HOME}`, `${data.max_prompt_length}`) resolved,
foreign layouts (EasyR1's keys, NeMo RL's sections) read as rlstack's, then built into `Config` with each
value converted to its field's type, validated, and its derived defaults filled in.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from omegaconf import OmegaConf

import rlstack.config.tree as tree
from rlstack.config.actor import DEFINED_AGG_MODES, actor_micro_batch
from rlstack.config.compat import easyr1, nemo_rl
from rlstack.config.critic import critic_micro_batch
from rlstack.config.fields import choices, type_name
from rlstack.config.interpolation import Interpolated, decoded, first_line, resolve_interpolations
from rlstack.config.machine import engine_choice, resolve_device
from rlstack.config.own_data import own_data_rule
from rlstack.config.reward import local_judge_note
from rlstack.config.schema import (
    MASK,
    Config,
    ConfigError,
    config_problems,
    machine_problems,
    masked_secrets,
)


def load_config(
    args: list[str] | None = None,
    base: dict | None = None,
    machine_checks: str = "error",
    rewards: bool = True,
    trains: bool = True,
) -> Config:
    """Build a validated Config from `config=file.yaml` and `a.b=c` arguments.

    `base` is an optional dict merged between the defaults and the YAML file (used by built-in
    recipes such as the demo). `machine_checks="warn"`: what this machine cannot run (no GPU, vLLM or
    flash-attn not installed, ...) is printed as warnings instead of stopping the load: to check on a
    laptop a config meant for a GPU node (`--print-config --machine-checks=warn`); every other problem
    still stops it. `rewards=False` (supervised fine-tuning): a config on its own rows need not name a
    reward function. `trains=False` (`rlstack eval`): the config's training rows are not read.
    """
    problems: list[str] = []
    layers: list[tuple[dict, dict[str, str]]] = []  # (values, key -> where it came from)
    if base:
        layers.append((base, {}))
    overrides = []
    for arg in args or []:
        if arg.startswith("~") and "/" not in arg.split("=", 1)[0]:  # not a home-relative path
            problems.append(
                f"argument {arg!r} deletes a key (Hydra's ~key): every rlstack key has a default; set "
                f"{arg[1:].split('=', 1)[0]}=<value> instead"
            )
            continue
        if arg.startswith("+") and "=" in arg:  # Hydra's +key=value (add) and ++key=value (add or set): set
            arg = arg.lstrip("+")
        if "=" not in arg and arg.endswith((".yaml", ".yml")):
            problems.append(f"argument {arg!r} is a config file without config=: did you mean config={arg}?")
        elif "=" not in arg:
            problems.append(f"argument {arg!r} is not of the form key=value (for example worker.rollout.n=8)")
        elif arg.startswith("config="):
            layers += _config_file(arg.split("=", 1)[1], problems)
        else:
            overrides.append(arg)
    for arg in overrides:  # one at a time, so that a problem names its own
        try:
            # `key=` means the empty string (OmegaConf would read it as null); interpolations stay text here.
            dotlist = OmegaConf.to_container(
                OmegaConf.from_dotlist([arg + "''" if arg.endswith("=") else arg])
            )
        except Exception as e:  # omegaconf grammar errors
            hint = "; write \\${ for a literal ${" if "${" in arg else ""
            problems.append(f"could not parse the override {arg!r}: {first_line(e)}{hint}")
        else:
            layers.append((dotlist, {arg.split("=", 1)[0]: f"command-line override {arg!r}"}))

    merged: dict = {}
    sources: dict[str, str] = {}
    for values, where in layers:
        tree.merge(merged, values)
        sources.update(where)

    # a reference to a key the file leaves out reads the default it takes here (EasyR1's, in an EasyR1 file)
    interpolated = resolve_interpolations(merged, sources, problems, easyr1.dialect_defaults(merged, sources))
    if nemo_rl.is_nemo_rl(merged):
        nemo_rl.translate(merged, sources, problems)  # NeMo RL's layout, read as rlstack's
    easyr1.translate(merged, sources, problems)  # EasyR1's names for rlstack's keys, and its extra keys
    own_notes = own_data_rule(
        merged, problems, rewards, trains
    )  # the demo's defaults out of a run on its own rows
    for key in masked_secrets(merged):
        env = " or the OPENAI_API_KEY environment variable" if key == "worker.reward.judge.api_key" else ""
        problems.append(
            f"{key} is {MASK!r} {tree.at(sources.get(key, ''))}: rlstack writes that in config.yaml in place of a "
            f"secret; give the value again ({key}=...{env})"
        )
    cfg = _build(Config, merged, "", sources, problems, interpolated)
    _resolve_backend(cfg)
    notes = own_notes + [note for clamp in (actor_micro_batch, critic_micro_batch) if (note := clamp(cfg))]
    machine: list[str] = []
    _resolve_engine(cfg, machine)
    problems += config_problems(cfg, machine=False)
    machine += machine_problems(cfg)
    if machine_checks == "warn":
        notes += [f"this machine cannot run it: {m}" for m in machine]
    else:
        problems += machine
    if problems:
        raise ConfigError(problems)
    _fill_derived_defaults(cfg)
    notes += [note] if (note := local_judge_note(cfg)) else []
    for note in notes:
        print(f"[rlstack] note: {note}", file=sys.stderr)
    return cfg


def _resolve_backend(cfg: Config) -> None:
    """`trainer.backend=auto`: Ray where the run needs more than this process (several ranks, or rollout
    engines in actors of their own), else local. Resolved before validation, which checks the result."""
    t = cfg.trainer
    if t.backend == "auto":
        several_ranks = t.nnodes * t.n_gpus_per_node > 1
        t.backend = "ray" if several_ranks or not cfg.worker.rollout.colocated else "local"


def _resolve_engine(cfg: Config, problems: list[str]) -> None:
    """`worker.rollout.name=auto`: vLLM when it is installed and the run is on CUDA, else the HF engine,
    and why (`RolloutConfig.auto_reason`, which the trainer says at start). Resolved before validation,
    which checks the result; a setting only vLLM has (tensor_parallel_size > 1) with auto picking hf is
    one problem naming both ways out."""
    r = cfg.worker.rollout
    if r.name != "auto":
        return
    try:
        device = resolve_device(cfg.trainer.device)
    except Exception:  # a bad trainer.device is its own problem
        device = "cpu"
    name, why = engine_choice(device)
    if name == "hf" and r.tensor_parallel_size > 1:
        problems.append(
            f"worker.rollout.tensor_parallel_size = {r.tensor_parallel_size} needs the vLLM engine, but "
            f"worker.rollout.name=auto picks hf here: {why}. Install vLLM on a GPU machine "
            "(pip install 'rlstack[vllm]'), or set worker.rollout.tensor_parallel_size=1"
        )
        return  # left at auto, which the engine rules read as hf without saying it again
    r.name, r.auto_reason = name, why


def _fill_derived_defaults(cfg: Config) -> None:
    """Keys whose default depends on another key, resolved once so that `--print-config` and the run's
    config.yaml show the value used."""
    a = cfg.worker.actor
    if a.loss_agg_mode is None:
        a.loss_agg_mode = DEFINED_AGG_MODES.get(a.loss_type, "token-mean")
    r = cfg.worker.rollout
    r.agent.tool_call_format = r.agent.call_format  # unset: the tool contract's
    if r.name == "vllm" and r.free_cache_engine is None:
        r.free_cache_engine = resolve_device(cfg.trainer.device) == "cuda"
    if r.name == "vllm" and r.max_model_len is None:
        r.max_model_len = cfg.data.max_prompt_length + cfg.data.max_response_length


def _config_file(
    path: str, problems: list[str], seen: tuple[str, ...] = ()
) -> list[tuple[dict, dict[str, str]]]:
    """A config file's layers: the files its `defaults` names (NeMo RL's inheritance: paths relative to the
    file, each with its own defaults), then the file itself."""
    loaded = _load_yaml(path, problems)
    if loaded is None:
        return []
    values, where = loaded
    parents = values.pop("defaults", None)
    layers: list[tuple[dict, dict[str, str]]] = []
    for parent in [parents] if isinstance(parents, str) else parents or []:
        full = str((Path(path).parent / parent).resolve())
        if full in seen or full == str(Path(path).resolve()):
            problems.append(f"{path}: defaults {parent!r} includes itself")
        elif not Path(full).is_file():
            problems.append(
                f"{where.get('defaults', path)}: defaults {parent!r} is not next to the file ({full}); copy the "
                "base config there (NeMo RL's are in its examples/configs), or write its keys out"
            )
        else:
            layers += _config_file(full, problems, (*seen, str(Path(path).resolve())))
    return [*layers, (values, where)]


def _load_yaml(path: str, problems: list[str]) -> tuple[dict, dict[str, str]] | None:
    p = Path(path)
    if p.is_dir():
        found = sorted(x.name for x in p.glob("*.y*ml"))[:5]
        problems.append(
            f"config={path} is a directory: name a YAML file in it (config=path/to/file.yaml)"
            + (f"; it holds {', '.join(found)}" if found else "")
        )
        return None
    if not p.is_file():
        problems.append(f"config file {path!r} does not exist (pass config=path/to/file.yaml)")
        return None
    try:
        text = p.read_text()
        node = yaml.compose(text)
        values = yaml.safe_load(text)
    except UnicodeDecodeError as e:
        problems.append(f"config file {path} is not UTF-8 text (byte {e.start}): save it as UTF-8")
        return None
    except yaml.YAMLError as e:
        problems.append(_yaml_problem(path, text, e))
        return None
    if values is None:
        return {}, {}
    if not isinstance(values, dict):
        problems.append(f"config file {path} must hold a mapping of sections, not {type(values).__name__}")
        return None
    where: dict[str, str] = {}

    def walk(n: yaml.Node, prefix: str) -> None:
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                key = f"{prefix}{k.value}"
                if key in where and isinstance(k, yaml.ScalarNode):  # YAML keeps the last one, silently
                    problems.append(
                        f"config file {path}, line {k.start_mark.line + 1}: {key} is set twice (first at "
                        f"{where[key].rsplit(', ', 1)[-1]}); keep one"
                    )
                where[key] = f"{path}, line {k.start_mark.line + 1}"
                walk(v, key + ".")

    walk(node, "")
    return values, where


def _yaml_problem(path: str, text: str, e: yaml.YAMLError) -> str:
    """A YAML error at its line and column of file `path` (PyYAML, given the text, calls it `<unicode string>`),
    with what the parser found, what it was reading and the line's text."""
    if isinstance(e, yaml.reader.ReaderError):  # a character YAML does not allow: a position in the text
        line = text.count("\n", 0, e.position)
        column = e.position - (text.rfind("\n", 0, e.position) + 1)
        character = chr(e.character) if isinstance(e.character, int) else e.character
        what = f"character {character!r} is not allowed in YAML"
    elif isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        line, column, what = e.problem_mark.line, e.problem_mark.column, e.problem or "cannot be read"
        if e.context and e.context_mark is not None:
            what += f", {e.context} at line {e.context_mark.line + 1}, column {e.context_mark.column + 1}"
    else:
        return f"config file {path} is not valid YAML: {e}"
    lines = text.splitlines()
    shown = (
        f": {lines[line].strip()!r}"
        if line < len(lines) and lines[line].strip()
        else " (the end of the file)"
    )
    return (
        f"config file {path}, line {line + 1}, column {column + 1}: not valid YAML ({what}){shown}; fix the "
        "indentation, quotes or brackets there"
    )


def _build(
    cls: type,
    values: Any,
    prefix: str,
    sources: dict[str, str],
    problems: list[str],
    interpolated: dict[str, Interpolated] | None = None,
) -> Any:
    """`cls` built from `values`, each converted to its field's type; problems appended. `interpolated`:
    the keys whose value an interpolation gave (`resolve_interpolations`): text from an environment
    variable where a number or a boolean belongs is read as one (`${oc.env:STEPS}` filling an int), as
    OmegaConf's typed configs (EasyR1's) do."""
    interpolated = interpolated or {}
    if not isinstance(values, dict):
        where = sources.get(prefix.rstrip("."), "")
        problems.append(
            f"{prefix.rstrip('.')}: expected a section (mapping), got {values!r} {tree.at(where)}"
        )
        return cls()
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.5)
            hint = f"did you mean {prefix}{close[0]}?" if close else f"valid keys: {', '.join(names)}"
            where = sources.get(dotted) or next(
                (v for k, v in sources.items() if k.startswith(dotted + ".")), ""
            )
            problems.append(f"unknown key {dotted} {tree.at(where)}: {hint}".replace("  ", " "))
            continue
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, dotted + ".", sources, problems, interpolated)
            continue
        ok, converted = _check_type(value, tp)
        if not ok and isinstance(value, str) and typing.get_origin(tp) is list:
            ok, converted = _check_type([value], tp)  # `trainer.logger=file` is `[file]`
        given = interpolated.get(dotted)
        if not ok and given is not None and isinstance(value, str):
            ok, converted = _check_type(decoded(value), tp)  # `${oc.env:STEPS}`: text, read as a number
        if ok:
            kwargs[key] = converted
        else:
            got = "a secret's text" if given and given.secret else f"{value!r} ({type(value).__name__})"
            unset = value == "" and "command-line override" in sources.get(dotted, "")  # `key=$UNSET`
            problems.append(
                f"{dotted} {tree.at(sources.get(dotted, ''))}: expected {_expected(tp)}, got {got}"
                + (f" from {given.text}" if given else "")
                + _choice_elsewhere(value, dotted)
                + (
                    "; the command line gives it no value (a shell variable there that is not set?)"
                    if unset
                    else ""
                )
            )
    return cls(**kwargs)


def _expected(tp: Any) -> str:
    """The type a value should have; for a `Literal`, its choices."""
    options = choices(tp)
    if not options:
        return type_name(tp)
    listed = [str(o) for o in options] + ["null"] * (type(None) in typing.get_args(tp))
    return f"one of {', '.join(listed[:-1])} or {listed[-1]}" if len(listed) > 1 else listed[0]


OTHER_NAMES: dict[tuple[str, str], str] = {
    ("algorithm.adv_estimator", "reinforce"): "REINFORCE++ (EasyR1's reinforce) is reinforce_plus_plus here "
    "(reinforce_plus_plus_baseline subtracts the group mean first; examples/recipes/reinforce_pp.yaml)",
    ("algorithm.adv_estimator", "reinforce++"): "REINFORCE++ is reinforce_plus_plus here "
    "(reinforce_plus_plus_baseline subtracts the group mean first; examples/recipes/reinforce_pp.yaml)",
    ("algorithm.adv_estimator", "dapo"): "DAPO is adv_estimator=grpo with algorithm.online_filtering=true, "
    "worker.actor.clip_ratio_high=0.28 and worker.reward.overlong_buffer_length (examples/recipes/dapo.yaml)",
    (
        "algorithm.adv_estimator",
        "ppo",
    ): "PPO with a critic is adv_estimator=gae (examples/recipes/ppo_gae.yaml)",
    (
        "algorithm.adv_estimator",
        "dr_grpo",
    ): "Dr.GRPO is adv_estimator=grpo with algorithm.norm_adv_by_std_in_grpo="
    "false and worker.actor.loss_agg_mode=seq-mean-token-sum-norm (examples/recipes/dr_grpo.yaml)",
}
"""Names the seeds use for a key's value that are not a choice of any key, (key, value) -> what rlstack
calls it; the choices of other keys (gspo, cispo: worker.actor.loss_type) are found by `_choice_keys`."""


def _choice_elsewhere(value: Any, key: str) -> str:
    """`; gspo is a choice of worker.actor.loss_type` when a wrong choice belongs to another key, or what
    rlstack calls a name the seeds use (`OTHER_NAMES`)."""
    if not isinstance(value, str):
        return ""
    if (key, value.lower()) in OTHER_NAMES:
        return f"; {OTHER_NAMES[key, value.lower()]}"
    keys = [k for k in _choice_keys().get(value, ()) if k != key]
    return f"; {value} is a choice of {' and '.join(keys)}" if keys else ""


@functools.cache
def _choice_keys(cls: type = Config, prefix: str = "") -> dict[str, tuple[str, ...]]:
    """Every `Literal` choice of the config -> the keys that offer it."""
    out: dict[str, tuple[str, ...]] = {}
    for name, tp in typing.get_type_hints(cls).items():
        inner = _choice_keys(tp, f"{prefix}{name}.") if dataclasses.is_dataclass(tp) else {}
        own = {str(c): (f"{prefix}{name}",) for c in choices(tp)}
        for part in (inner, own):
            for value, keys in part.items():
                out[value] = out.get(value, ()) + keys
    return out


NUMBER_TEXT = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)[eE][+-]?\d+|[+-]?(inf|infinity|nan)", re.I)
"""Numbers that YAML 1.1 (PyYAML) or OmegaConf's command line read as text: `1e-5` (no dot), `inf`, `nan`."""


def _number(value: Any) -> Any:
    """`value`, or the number its text writes where YAML read a number as text (`NUMBER_TEXT`)."""
    if isinstance(value, str) and NUMBER_TEXT.fullmatch(value):
        return float(value)
    return value


def _check_type(value: Any, tp: Any) -> tuple[bool, Any]:
    origin = typing.get_origin(tp)
    if tp is Any:
        return True, value
    if origin is Literal:
        return value in typing.get_args(tp), value
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            ok, v = _check_type(value, arg)
            if ok:
                return True, v
        return False, value
    if tp is type(None):
        return value is None, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        number = _number(value)
        if isinstance(number, float) and number.is_integer() and abs(number) < 2**53:  # 1e3 (text in YAML)
            return True, int(number)
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        number = _number(value)
        if isinstance(number, (int, float)) and not isinstance(number, bool):
            return True, float(number)
        return False, value
    if tp is str:  # a name such as experiment_name=2024 arrives from YAML/CLI as a number
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, str(value)
        return isinstance(value, str), value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            return False, value
        (item,) = typing.get_args(tp)
        out = []
        for v in value:
            ok, cv = _check_type(v, item)
            if not ok:
                return False, value
            out.append(cv)
        return True, out
    if origin is dict:
        return isinstance(value, dict), dict(value) if isinstance(value, dict) else value
    raise TypeError(f"config type {tp} is not supported by the loader")
