"""builtin:python tools for the tests: `run` a cell in one, and `making_tools`, which makes them and
closes every one it made."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rlstack.tools.base import ToolCall
from rlstack.tools.python import PythonTool


def run(tool: PythonTool, code: str):
    """The observation of `code` run as one cell of `tool`."""
    return tool.execute(ToolCall("python", {"code": code}, ""))


@contextlib.contextmanager
def making_tools(**defaults) -> Iterator[Callable[..., PythonTool]]:
    """`make(images=(), **kwargs)`: a tool with `defaults` (`kwargs` over them), reset for one
    trajectory with `images`; every tool it made is closed when the block ends."""
    tools: list[PythonTool] = []

    def make(images=(), **kwargs) -> PythonTool:
        tool = PythonTool(**{**defaults, **kwargs})
        tool.reset(list(images), {})
        tools.append(tool)
        return tool

    try:
        yield make
    finally:
        for tool in tools:
            tool.close()
