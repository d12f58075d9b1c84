"""The house rules, read from the source with ``ast``: the arrows between packages, one error root, and
sizes a reader can hold (:data:`MAX_MODULE_LINES`, :data:`MAX_FUNCTION_LINES`).

Arrows point inward (README, "Architecture"): ``gateway``, ``agent``, ``ops`` -> ``projections`` ->
``core`` -> ``schemas``; ``schemas`` imports nothing of ours. The three edge packages do not import
each other, except where :data:`EDGE_IMPORTS` says why.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("schemas", "core", "projections", "gateway", "agent", "ops")
INWARD = {
    "schemas": set(),
    "core": {"schemas"},
    "projections": {"core", "schemas"},
    "gateway": {"projections", "core", "schemas"},
    "agent": {"projections", "core", "schemas"},
    "ops": {"projections", "core", "schemas"},
}
EDGE_IMPORTS: dict[str, str] = {
    "ops/cli/main.py -> agent.cli": "the one `resontech` command runs every process, the agent's too",
    "ops/cli/main.py -> gateway.serve": "the one `resontech` command runs every process, the gateway's too",
    "ops/cli/main.py -> gateway.settings": "the one `resontech` command runs the gateway too",
    "ops/cli/ -> gateway.client": "the CLI speaks to the API through the SDK",
    "ops/devstack/stack.py -> agent.enroll": "the dev stack enrolls its two local agents as a provider would",
    "ops/cli/workers.py -> agent.identity": "enrolling a state dir writes the agent's identity",
    "ops/dispatcher/service.py -> agent.commands": "the dispatcher takes commands by the agent's rules",
    "ops/dispatcher/service.py -> agent.heartbeat": "the dispatcher claims as an agent does, retried alike",
    "ops/dispatcher/service.py -> agent.state": "the dispatcher remembers handled commands as an agent does",
    "ops/dispatcher/rounds.py -> agent.reports": "the dispatcher meters a pod with the agent's meter",
    "ops/dispatcher/run.py -> agent.identity": "the dispatcher holds its state dir with the agent's lock",
}
"""Edge-to-edge imports and why (a path ending in ``/`` stands for every module below it);
``ops/bench/`` drives every part and may import any of them."""
OUTSIDE_THE_ROOT: dict[str, str] = {
    "UnknownFamily": "schemas imports nothing of ours, so its one error cannot derive from core's root",
    "ConnectionClosed": "a WebSocket close frame: its code is the frame's number, not an error code",
    "FeedClose": "a WebSocket close frame: its code is the frame's number, not an error code",
}
"""Exception classes that stand outside :class:`core.errors.ResontechError`, and why."""
SIZED = (*PACKAGES, "examples")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def _modules() -> list[tuple[str, Path, ast.Module]]:
    return [
        (package, path, ast.parse(path.read_text()))
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
    ]


def _imports(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return [name for name in found if name.split(".")[0] in PACKAGES]


def _covers(rule: str, path: str, module: str) -> bool:
    where, _, what = rule.partition(" -> ")
    return module == what and (path == where or (where.endswith("/") and path.startswith(where)))


def test_arrows_point_inward_and_edges_import_each_other_only_where_the_rule_says_why() -> None:
    wrong, used = [], set()
    for package, path, tree in _modules():
        relative = path.relative_to(REPO).as_posix()
        for name in _imports(tree):
            target = name.split(".")[0]
            if target == package or target in INWARD[package]:
                continue
            edge = f"{relative} -> {name}"
            if relative.startswith("ops/bench/") and package == "ops":
                continue
            allowed = [rule for rule in EDGE_IMPORTS if _covers(rule, relative, name)]
            used.update(allowed)
            if not allowed:
                wrong.append(edge)
    assert not wrong, "imports against the arrows:\n" + "\n".join(wrong)
    assert set(EDGE_IMPORTS) == used, f"exceptions no longer needed: {set(EDGE_IMPORTS) - used}"


Klass = tuple[str, str]  # (module path, class name)


def _classes() -> dict[Klass, list[str]]:
    return {
        (path.relative_to(REPO).as_posix(), node.name): [ast.unparse(b).split(".")[-1] for b in node.bases]
        for _, path, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }


def _bases(classes: dict[Klass, list[str]], klass: Klass) -> list[Klass]:
    """The classes ``klass`` derives from: of its own module first, else of any module by name."""
    found = []
    for name in classes[klass]:
        same = (klass[0], name)
        found += [same] if same in classes else [k for k in classes if k[1] == name]
    return found


def _derives(classes: dict[Klass, list[str]], klass: Klass, roots: set[str]) -> bool:
    if klass[1] in roots or any(b in roots for b in classes[klass]):
        return True
    return any(_derives(classes, base, roots) for base in _bases(classes, klass) if base != klass)


def test_every_error_derives_from_the_one_root() -> None:
    classes = _classes()
    errors = [
        k for k in classes if _derives(classes, k, {"Exception", "ValueError", "RuntimeError", "OSError"})
    ]
    outside = sorted(
        f"{path}: {name}" for path, name in errors if not _derives(classes, (path, name), {"ResontechError"})
    )
    assert {line.split(": ")[1] for line in outside} == set(OUTSIDE_THE_ROOT), outside


@pytest.mark.parametrize("name", sorted(OUTSIDE_THE_ROOT))
def test_each_exception_outside_the_root_says_why(name: str) -> None:
    assert len(OUTSIDE_THE_ROOT[name]) > 20


def test_a_private_file_is_written_whole_and_for_its_owner_only(tmp_path: Path) -> None:
    from core.files import write_private

    path = tmp_path / "secret.json"
    write_private(path, '{"key": 1}')
    write_private(path, b'{"key": 2}')
    assert path.read_text() == '{"key": 2}' and path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["secret.json"]  # no temporary file left


def _sized() -> list[tuple[str, ast.Module, int]]:
    return [
        (path.relative_to(REPO).as_posix(), ast.parse(text := path.read_text()), len(text.splitlines()))
        for package in SIZED
        for path in sorted((REPO / package).rglob("*.py"))
    ]


def test_no_module_runs_past_the_limit() -> None:
    long = [f"{path}: {lines} lines" for path, _, lines in _sized() if lines > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(long)


def test_no_function_runs_past_the_limit() -> None:
    long = [
        f"{path}:{node.lineno} {node.name}: {lines} lines"
        for path, tree, _ in _sized()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (lines := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)
