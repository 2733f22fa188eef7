"""Namespace tools (`{"type": "namespace", "name", "tools": [functions and custom tools]}`, as Codex
sends its sub-agent tools): the model sees each inner tool as a tool of its own named
`<namespace>__<name>` (`flat_name`), with the namespace's description before its own; a call of
one comes back with the inner `name` and the `namespace` (`Namespaces.split`), as OpenAI returns
it and Codex expects it, and a call passed back with a `namespace` is rendered under the flat name
again, so the model sees the same names on every turn."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from coreai.server.errors import bad_request
from coreai.server.responses import local_shell
from coreai.server.responses import schemas as r

SEPARATOR = "__"


def flat_name(namespace: str | None, name: str) -> str:
    """The name the model sees for `name` in `namespace` (None: `name` itself)."""
    return f"{namespace}{SEPARATOR}{name}" if namespace else name


@dataclass
class Namespaces:
    """The flat tools of a request's `tools` and where each namespaced one came from."""

    tools: list[r.FunctionTool | r.CustomTool] = field(default_factory=list)
    origin: dict[str, tuple[str, str]] = field(default_factory=dict)  # flat name -> (namespace, name)
    local_shell: bool = False  # the request has the `local_shell` tool (`local_shell.py`)

    def is_local_shell(self, name: str) -> bool:
        """Whether a call of `name` (flat) is a call of the `local_shell` tool."""
        return self.local_shell and name == local_shell.NAME

    def split(self, name: str) -> tuple[str, str | None]:
        """A called tool's (name, namespace) as the client named it (a tool outside any namespace:
        (name, None))."""
        namespace, inner = self.origin.get(name, (None, name))
        return inner, namespace


def flatten(
    tools: Sequence[r.FunctionTool | r.CustomTool | r.NamespaceTool | r.LocalShellTool | r.HostedTool] | None,
) -> Namespaces:
    """The request's function and custom tools, namespaces flattened, `local_shell` as its function
    (`local_shell.tool`; hosted tools left out: the field policy names them). Raises a 400 naming
    `tools[i]` when two tools end up with one name."""
    out = Namespaces()
    seen: set[str] = set()
    inner: list[r.FunctionTool | r.CustomTool]
    for i, tool in enumerate(tools or []):
        if isinstance(tool, r.HostedTool):
            continue
        if isinstance(tool, r.LocalShellTool):
            inner = [local_shell.tool()]
            out.local_shell = True
        elif isinstance(tool, r.NamespaceTool):
            inner = []
            for inner_tool in tool.tools:
                name = flat_name(tool.name, inner_tool.name)
                described = " ".join(d for d in (tool.description, inner_tool.description) if d) or None
                inner.append(inner_tool.model_copy(update={"name": name, "description": described}))
                out.origin[name] = (tool.name, inner_tool.name)
        else:
            inner = [tool]
        for flat in inner:
            if flat.name in seen:
                raise bad_request(f"tools[{i}]: a second tool named {flat.name!r}", f"tools[{i}].name")
            seen.add(flat.name)
            out.tools.append(flat)
    return out
