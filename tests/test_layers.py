"""The import graph keeps the tree's promise: one folder per process, no loops.

Read statically from the source (every ``import`` anywhere in a module, the ones inside functions
included: a lazy import is still a dependency). Folders (``daemon/``, ``runner/``, …) are one node
each; top-level modules (the shared wire, settings and model knowledge) are a node each.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in (SRC / "modeld").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The modeld modules ``name`` imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in MODULES else module)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _node(module: str) -> str:
    """``modeld.daemon.pool`` → ``daemon/``; a top-level module is its own node."""
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and (SRC / "modeld" / parts[1]).is_dir()):
        return parts[1] + "/"
    return module


def _folder_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        for target in targets:
            if _node(module) != _node(target):
                graph.setdefault(_node(module), set()).add(_node(target))
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (as a path), or None: a depth-first search for a back edge."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def test_the_graph_reader_sees_known_edges() -> None:
    """The reader itself: it must find imports of each form, or the checks below prove nothing."""
    assert "modeld.wire.runnerwire" in GRAPH["modeld.daemon.supervisor"]  # from modeld import X
    assert "modeld.daemon.scheduler" in GRAPH["modeld.daemon.service"]  # from pkg.mod import
    assert "modeld.planning" in GRAPH["modeld.daemon.views"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


#: The one edge across: the fork server is a child the daemon forks from itself, which then runs
#: runner code (its entry point, like runner/__main__.py for a runner started as a process).
FORK_ENTRY = "modeld.daemon.forkserver -> modeld.runner.zygote"


@pytest.mark.parametrize(("one", "other"), [("daemon/", "runner/"), ("runner/", "daemon/")])
def test_each_process_folder_stays_out_of_the_other(one: str, other: str) -> None:
    """The daemon and the runner share only top-level modules (runnerwire: their contract)."""
    reaches = sorted(
        f"{m} -> {t}" for m, ts in GRAPH.items() for t in ts
        if _node(m) == one and _node(t) == other
    )  # fmt: skip
    assert reaches == ([FORK_ENTRY] if one == "daemon/" else [])


def test_no_loop_between_folders_or_shared_modules() -> None:
    assert _cycle(_folder_graph()) is None


def test_no_import_circle_between_modules() -> None:
    assert _cycle(GRAPH) is None


def test_runner_only_modules_are_not_imported_from_outside() -> None:
    """What runs only in the runner process is imported only there (and by its entry point)."""
    outside = sorted(
        f"{m} -> {t}" for m, ts in GRAPH.items() for t in ts
        if _node(t) == "runner/" and _node(m) not in ("runner/",)
    )  # fmt: skip
    assert outside == [FORK_ENTRY]


#: What each package may import, floor by floor (modules at the top level are named without
#: their ``modeld.`` prefix; ``modeld`` is the package itself, for its version). A new edge is a
#: design decision: add it here, and the cycle checks above say whether it is allowed at all.
ALLOWED: dict[str, set[str]] = {
    "model/": {"errors"},  # the file and the machine: nothing of modeld's above errors
    "schema/": {"errors", "jsondepth"},
    "replyparse/": {"jsondepth"},  # the one depth bound of JSON (stdlib only)
    "rpc/": {"errors", "model/"},
    "cache/": {"errors", "model/"},
    "pull/": {"errors", "modeld"},
    # loadfields: the settings' defaults
    "wire/": {"config", "errors", "jsondepth", "model/", "rpc/"},
    "runner/": {"errors", "model/", "replyparse/", "rpc/", "sizing", "wire/"},
    "http/": {"config", "describe", "errors", "model/", "modeld", "pull/", "registry",
              "replyparse/", "settingvalues", "wire/"},
    "daemon/": {"cache/", "config", "errors", "http/", "model/", "modeld", "paths", "planning",
                "projector", "registry", "replyparse/", "rpc/", "runner/", "schema/",
                "settingvalues", "sizing", "wire/"},  # runner/: the fork server's entry only
    "cluster/": {"client", "config", "errors", "http/", "settingvalues"},
    "cli/": {"client", "cluster/", "config", "daemon/", "describe", "errors", "model/", "modeld",
             "paths", "pull/", "registry", "rpc/", "settingvalues", "socketcheck", "wire/"},
    "docgen/": {"cli/", "config", "errors", "modeld", "settingvalues"},
}


def test_each_package_imports_only_what_its_floor_allows() -> None:
    graph = _folder_graph()
    packages = {_node(m) for m in MODULES if _node(m).endswith("/")}
    assert packages == set(ALLOWED), "a package without a row in ALLOWED (or a row too many)"
    extra = {
        pkg: sorted(t.removeprefix("modeld.") for t in graph.get(pkg, set())
                    if t.removeprefix("modeld.") not in ALLOWED[pkg])
        for pkg in ALLOWED
    }  # fmt: skip
    assert {p: e for p, e in extra.items() if e} == {}
