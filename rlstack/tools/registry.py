"""Tools named in the config, and the per-trajectory instances the agent loop calls.

A tool is described by a config-like dict (one entry of the agent's tool list)::

    {"import_path": "builtin:python", "kwargs": {"timeout_s": 10}}
    {"import_path": "builtin:zoom", "name": "image_zoom_in_tool"}
    {"import_path": "path/to/my_tools.py:Calculator", "schema": {...}}
    {"import_path": "my_package.tools:Search", "name": "search"}

- `import_path`: `builtin:<name>` (`builtin:python`, `builtin:zoom`), `package.module:Class`, or
  `path/to/file.py:Class`; the class follows the protocol in `tools/base.py`.
- `name`: what the model calls it; default the class's `name`. The schema's function name follows it.
- `schema`: replaces the class's OpenAI function schema.
- `kwargs`: keyword arguments of the class's constructor (its limits), checked against its signature.
  A constructor that takes `contract` is given the agent's tool contract (`tools/contract.py`,
  `worker.rollout.agent.tool_contract`; `builtin:python` names the input images by it), never by `kwargs`.

`build_toolset` resolves every spec once, at start-up, and reports a problem with the spec's index,
the key and the fix (`ToolConfigError`); it builds one instance of each tool and closes it again, so
that bad limits fail there rather than mid-rollout. `ToolSet.new(images, extra)` gives each
trajectory its own `Toolbox` of fresh instances, and `Toolbox.call` turns every outcome (unknown
tool, malformed call, a tool that raises) into an `Observation`. `ToolSet.hermes_tools_prompt()`
renders the tools block of Qwen2.5's chat template for the system prompt; `ToolSet.schemas` is the
same list for `apply_chat_template(..., tools=...)`.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from rlstack.errors import RLStackError
from rlstack.extensions import load_module
from rlstack.tools.base import Observation, Tool, ToolCall, failed
from rlstack.tools.parsing import ToolCallError

BUILTINS: dict[str, str] = {
    "python": "rlstack.tools.python:PythonTool",
    "zoom": "rlstack.tools.zoom:ZoomTool",
}
"""`builtin:<name>` -> the import path of its class."""

_METHODS = ("reset", "execute", "close")

_HERMES_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_HERMES_FOOTER = (
    "</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)


class ToolConfigError(RLStackError, ValueError):
    """A tool spec that cannot be resolved, naming the spec and how to fix it."""


@dataclass(frozen=True)
class ToolSpec:
    """One tool of the agent, as written in the config (see module docstring)."""

    import_path: str
    """`builtin:python`, `builtin:zoom`, `package.module:Class` or `path/to/file.py:Class`."""
    name: str | None = None
    """What the model calls the tool; None: the class's `name`."""
    schema: dict[str, Any] | None = None
    """OpenAI function schema replacing the class's; None: the class's `schema`."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the tool's constructor (its limits)."""

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any], where: str = "tools[0]") -> ToolSpec:
        """A spec from a config dict; unknown keys are errors that suggest the closest valid key."""
        keys = ("import_path", "name", "schema", "kwargs")
        for key in spec:
            if key not in keys:
                close = difflib.get_close_matches(str(key), keys, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ToolConfigError(f"{where}: unknown key {key!r}{hint} Keys are {list(keys)}")
        if "import_path" not in spec:
            raise ToolConfigError(f"{where}: 'import_path' is required, e.g. 'builtin:python'")
        plain = _plain(spec)
        return cls(
            import_path=plain["import_path"],
            name=plain.get("name"),
            schema=plain.get("schema"),
            kwargs=plain.get("kwargs") or {},
        )


@dataclass(frozen=True)
class _Entry:
    name: str
    cls: type
    kwargs: dict[str, Any]
    schema: dict[str, Any]


@dataclass
class Toolbox:
    """One trajectory's tool instances, keyed by the name the model calls them by."""

    tools: dict[str, Tool]

    def call(self, parsed: ToolCall | ToolCallError) -> Observation:
        """The observation for a parsed call; never raises (a failure is an observation with ok=False)."""
        if isinstance(parsed, ToolCallError):
            return failed(parsed.message)
        tool = self.tools.get(parsed.name)
        if tool is None:
            return failed(f"there is no tool {parsed.name!r}; the tools are {sorted(self.tools)}")
        try:
            observation = tool.execute(parsed)
        except Exception as e:
            return failed(f"tool {parsed.name!r} raised {type(e).__name__}: {e}")
        if not isinstance(observation, Observation):
            return failed(f"tool {parsed.name!r} returned {type(observation).__name__}, not an Observation")
        return observation

    def close(self) -> None:
        """Close every tool (stops interpreters, removes their files); safe to call twice."""
        errors = []
        for tool in self.tools.values():
            try:
                tool.close()
            except Exception as e:  # close the others first
                errors.append(e)
        if errors:
            raise errors[0]

    def __enter__(self) -> Toolbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ToolSet:
    """The resolved tools of an agent: makes each trajectory's `Toolbox` and the system prompt's tool list."""

    def __init__(self, specs: Sequence[ToolSpec], entries: list[_Entry], contract: str) -> None:
        self.specs = tuple(specs)
        self._entries = entries
        self.contract = contract

    @property
    def names(self) -> list[str]:
        return [e.name for e in self._entries]

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The OpenAI function schemas, in spec order (`apply_chat_template(..., tools=schemas)`)."""
        return [copy.deepcopy(e.schema) for e in self._entries]

    def new(self, images: list[Image.Image], extra: dict[str, Any]) -> Toolbox:
        """Fresh instances of every tool for one trajectory, each reset with its input images."""
        tools: dict[str, Tool] = {}
        try:
            for e in self._entries:
                tool = e.cls(**e.kwargs)
                tools[e.name] = tool
                tool.reset(images, extra)
        except BaseException:
            Toolbox(tools).close()
            raise
        return Toolbox(tools)

    def hermes_tools_prompt(self) -> str:
        """The `# Tools` block that Qwen2.5's chat template puts in the system prompt (one JSON per line)."""
        if not self._entries:
            return ""
        lines = [json.dumps(schema, ensure_ascii=False) for schema in self.schemas]
        return "\n".join([_HERMES_HEADER, *lines, _HERMES_FOOTER])

    def __reduce__(self):
        """Pickled as its specs and rebuilt on the other side (tool classes loaded from a file path
        live in a module only this process has)."""
        return build_toolset, (self.specs, "tools", self.contract)


def build_toolset(
    specs: Sequence[ToolSpec | Mapping[str, Any]], key: str = "tools", contract: str = "rlstack"
) -> ToolSet:
    """Resolve `specs` (see module docstring); `ToolConfigError` names the spec, the problem and the fix.

    `key` is where the specs live in the config (e.g. `worker.rollout.agent.tools`), for the messages;
    `contract` is the agent's tool contract, given to the tools whose constructor takes one.
    """
    resolved = [
        s if isinstance(s, ToolSpec) else ToolSpec.from_dict(s, f"{key}[{i}]") for i, s in enumerate(specs)
    ]
    entries: list[_Entry] = []
    for i, spec in enumerate(resolved):
        entry = _resolve(spec, f"{key}[{i}] ({spec.import_path})", contract)
        clash = [j for j, e in enumerate(entries) if e.name == entry.name]
        if clash:
            raise ToolConfigError(
                f"{key}[{i}] and {key}[{clash[0]}] are both named {entry.name!r}; give one a different 'name'"
            )
        entries.append(entry)
    return ToolSet(resolved, entries, contract)


def _plain(value: Any) -> Any:
    """Plain dicts and lists all the way down (config loaders hand over their own container types)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _resolve(spec: ToolSpec, where: str, contract: str) -> _Entry:
    cls = _import_class(spec.import_path, where)
    missing = [m for m in _METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise ToolConfigError(
            f"{where}: {cls.__qualname__} lacks method(s) {missing}; a tool needs reset(images, extra), "
            "execute(call) -> Observation and close() (see rlstack/tools/base.py)"
        )
    name = spec.name if spec.name is not None else getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ToolConfigError(
            f"{where}: {cls.__qualname__} has no class attribute 'name'; set one or give 'name'"
        )
    schema = _schema(spec, cls, name, where)
    if "contract" in spec.kwargs:
        raise ToolConfigError(
            f"{where}: kwargs 'contract' is worker.rollout.agent.tool_contract's to set (for every tool at once); "
            "remove it from the tool's kwargs"
        )
    try:
        inspect.signature(cls).bind(**spec.kwargs)
    except TypeError as e:
        params = [p for p in inspect.signature(cls).parameters if p not in ("args", "kwargs")]
        raise ToolConfigError(
            f"{where}: kwargs {spec.kwargs} do not fit {cls.__qualname__}({params}): {e}"
        ) from e
    kwargs = dict(spec.kwargs)
    if "contract" in inspect.signature(cls).parameters:
        kwargs["contract"] = contract
    try:  # one instance now, so that bad limits fail at start-up rather than in the first rollout
        cls(**kwargs).close()
    except Exception as e:
        raise ToolConfigError(f"{where}: building {cls.__qualname__}(**{spec.kwargs}) failed: {e}") from e
    return _Entry(name, cls, kwargs, schema)


def _schema(spec: ToolSpec, cls: type, name: str, where: str) -> dict[str, Any]:
    """The tool's OpenAI function schema, its function name set to the tool's name."""
    schema = spec.schema if spec.schema is not None else getattr(cls, "schema", None)
    source = "'schema'" if spec.schema is not None else f"{cls.__qualname__}.schema"
    function = schema.get("function") if isinstance(schema, dict) else None
    if not (isinstance(function, dict) and schema.get("type") == "function" and "parameters" in function):
        raise ToolConfigError(
            f"{where}: {source} must be an OpenAI function schema: "
            '{"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}'
        )
    if spec.schema is not None and function.get("name") not in (None, name):
        raise ToolConfigError(
            f"{where}: 'schema' names the function {function['name']!r} but the tool is called {name!r}; "
            "make them agree (or drop the function name from the schema)"
        )
    schema = copy.deepcopy(schema)
    schema["function"]["name"] = name
    return schema


def _import_class(ref: str, where: str) -> type:
    if ref.startswith("builtin:"):
        builtin = ref.removeprefix("builtin:")
        if builtin not in BUILTINS:
            raise ToolConfigError(
                f"{where}: no built-in tool {builtin!r}; built-ins are {[f'builtin:{k}' for k in BUILTINS]}"
            )
        ref = BUILTINS[builtin]
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr:
        raise ToolConfigError(
            f"{where}: import_path must be builtin:<name>, package.module:Class or path/to/file.py:Class"
        )
    module = load_module(target, where, "tool file", ToolConfigError)
    cls = getattr(module, attr, None)
    if not inspect.isclass(cls):
        classes = [n for n, v in vars(module).items() if inspect.isclass(v) and not n.startswith("_")]
        raise ToolConfigError(f"{where}: {target!r} has no class {attr!r}; classes there: {classes}")
    return cls
