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
    "ops/enrollment.py -> agent.identity": "enrolling a state dir writes the agent's identity",
    "ops/dispatcher/service.py -> agent.commands": "the dispatcher takes commands by the agent's rules",
    "ops/dispatcher/service.py -> agent.heartbeat": "the dispatcher claims as an agent does, retried alike",
    "ops/dispatcher/service.py -> agent.state": "the dispatcher remembers handled commands as an agent does",
    "ops/dispatcher/rounds.py -> agent.reports": "the dispatcher meters a pod with the agent's meter",
    "ops/dispatcher/run.py -> agent.identity": "the dispatcher holds its state dir with the agent's lock",
    "ops/dispatcher/verification.py -> agent.verify": "a node's challenge runs the agent's program",
}
"""Edge-to-edge imports and why (a path ending in ``/`` stands for every module below it);
``ops/bench/`` drives every part and may import any of them."""
OUTSIDE_THE_ROOT: dict[str, str] = {
    "UnknownFamily": "schemas imports nothing of ours, so its one error cannot derive from core's root",
    "ConnectionClosed": "a WebSocket close frame: its code is the frame's number, not an error code",
    "FeedClose": "a WebSocket close frame: its code is the frame's number, not an error code",
    "CheckpointRefused": "the pod's supervisor is standard library only (it runs in the tenant's image)",
}
"""Exception classes that stand outside :class:`core.errors.ResontechError`, and why."""
SIZED = (*PACKAGES, "examples")
MAX_MODULE_LINES = 800
"""A signal, not a shape: a module past it is read for whether it still holds one thing. Below it, a
cohesive class keeps its one file rather than splitting into mixins to fit."""
MAX_FUNCTION_LINES = 60
LONG_FUNCTIONS: dict[str, str] = {
    "ops/dispatcher/endpoints.py:replica_objects": "a manifest written as one literal, as the API reads it",
}
"""Functions allowed past :data:`MAX_FUNCTION_LINES`, and why (``path:name``)."""


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


CLI_TESTS: dict[str, str] = {
    "test_cli_watch.py": "tests `resontech watch` and its screen",
    "test_sparkline.py": "tests the CLI's sparklines and its watch screen",
    "test_federated.py": "tests what `resontech status` shows of a federated job",
    "test_endpoints.py": "tests the CLI's line about an endpoint's traffic",
    "test_catalog.py": "tests `resontech schemas export`",
    "test_claims.py": "tests `resontech quarantine` on what the attacks left",
}
"""Test modules (by file name, wherever the test tree puts them) that import :mod:`ops.cli` because
they test the command itself. Nothing else imports it: other code runs it (``python -m ops.cli``) or
imports what it shares from modules of their own (:mod:`ops.enrollment`, :mod:`ops.specs`)."""


def _absolute_imports(tree: ast.Module) -> list[str]:
    """Every module (or ``module.name``) ``tree`` imports absolutely, anywhere in it (in a function too)."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return names


def _imports_the_cli(tree: ast.Module) -> bool:
    return any(name == "ops.cli" or name.startswith("ops.cli.") for name in _absolute_imports(tree))


def test_nothing_imports_the_cli_but_itself_and_the_tests_of_the_command() -> None:
    importers = [
        path.relative_to(REPO).as_posix()
        for folder in (*PACKAGES, "examples", "tests")
        for path in sorted((REPO / folder).rglob("*.py"))
        if _imports_the_cli(ast.parse(path.read_text()))
    ]
    wrong = [p for p in importers if not p.startswith("ops/cli/") and Path(p).name not in CLI_TESTS]
    assert not wrong, "modules that import ops.cli:\n" + "\n".join(wrong)
    unused = set(CLI_TESTS) - {Path(p).name for p in importers}
    assert not unused, f"exceptions no longer needed: {unused}"


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
        and f"{path}:{node.name}" not in LONG_FUNCTIONS
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def _is_data(statement: ast.stmt) -> bool:
    """Whether ``statement`` holds data the formatter would spread one item a line: an argv list (a
    list display with a ``-flag``), or a table of eight or more literal items."""
    for node in ast.walk(statement):
        if not isinstance(node, ast.List | ast.Tuple | ast.Set):
            continue
        items = node.elts
        if isinstance(node, ast.List) and any(
            isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value.startswith("-")
            for e in items
        ):
            return True
        if len(items) >= 8 and all(isinstance(e, ast.Constant | ast.BinOp | ast.Tuple) for e in items):
            return True
    return False


def test_the_formatter_wins_except_where_a_line_is_data() -> None:
    skipped = []
    for package in (*SIZED, "tests"):
        for path in sorted((REPO / package).rglob("*.py")):
            source = path.read_text()
            if "# fmt: skip" not in source:
                continue
            ends = {n.end_lineno: n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.stmt)}
            for number, line in enumerate(source.splitlines(), 1):
                statement = ends.get(number)
                if line.endswith("# fmt: skip") and (statement is None or not _is_data(statement)):
                    skipped.append(f"{path.relative_to(REPO)}:{number}")
    assert not skipped, "fmt: skip on a line that is not data (an argv list or a table):\n" + "\n".join(
        skipped
    )


TYPE_ONLY_CYCLES: dict[frozenset[str], str] = {
    frozenset({"gateway.client.aio", "gateway.client.calls", "gateway.client.sync"}): (
        "the SDK's calls are written once (`_Calls`) for both clients, and its descriptor types each "
        "method for the client it is read from: `calls` names `Client` and `AsyncClient`, which derive "
        "from `_Calls`, for the type checker only"
    ),
}
"""Import cycles that exist only through ``if TYPE_CHECKING:`` imports, and why; no cycle is
allowed at run time."""


def _module_names() -> dict[str, Path]:
    """Dotted module name -> file, for every module of our packages (a package by its ``__init__``)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name | ast.Attribute) and ast.unparse(test).endswith("TYPE_CHECKING")


def _top_level_imports(body: list[ast.stmt], typing_too: bool) -> list[ast.Import | ast.ImportFrom]:
    """The imports a module runs when imported (in ``if`` / ``try`` / ``with`` blocks too, not in
    functions); those under ``if TYPE_CHECKING:`` only with ``typing_too``."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            if typing_too or not _is_type_checking(node.test):
                found += _top_level_imports(node.body, typing_too)
            found += _top_level_imports(node.orelse, typing_too)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                found += _top_level_imports(block, typing_too)
        elif isinstance(node, ast.With):
            found += _top_level_imports(node.body, typing_too)
    return found


def _import_graph(typing_too: bool) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports: ``from a.b import c`` names ``a.b.c`` where that is
    a module, else ``a.b`` (the parent packages a submodule's import runs are not arrows)."""
    modules = _module_names()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in _top_level_imports(ast.parse(path.read_text()).body, typing_too):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            module = node.module or ""
            if node.level:
                module = ".".join([*base[: len(base) - node.level + 1], *filter(None, [node.module])])
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                targets.add(submodule if submodule in modules else module)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set(stack[stack.index(node) :])
                    del stack[stack.index(node) :]
                    if len(component) > 1:
                        found.add(frozenset(component))
            elif target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                work.append((target, iter(sorted(graph[target]))))
            elif target in stack:
                low[node] = min(low[node], index[target])
    return found


def test_no_import_cycle_at_run_time() -> None:
    cycles = _cycles(_import_graph(typing_too=False))
    assert not cycles, "modules that import each other:\n" + "\n".join(str(sorted(c)) for c in cycles)


def test_type_only_import_cycles_are_the_known_ones() -> None:
    cycles = _cycles(_import_graph(typing_too=True))
    assert cycles == set(TYPE_ONLY_CYCLES), "\n".join(str(sorted(c)) for c in cycles ^ set(TYPE_ONLY_CYCLES))


def test_the_cycle_finder_finds_a_cycle_and_only_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert _cycles(graph) == {frozenset({"a", "b", "c"})}
    assert _cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}}) == {
        frozenset({"a", "b"}),
        frozenset({"c", "d"}),
    }


def test_no_helper_module_shadows_a_name_the_support_package_defines() -> None:
    """``tests/support/__init__.py`` is what ``from tests.support import x`` reads; a module
    ``tests/support/x.py`` would replace that ``x`` on the package as soon as any test imported it, and
    the tests that ran after it in the same worker would call a module."""
    support = REPO / "tests" / "support"
    body = ast.parse((support / "__init__.py").read_text()).body
    defined = {
        node.name for node in body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    } | {
        target.id
        for node in body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    modules = {path.stem for path in support.glob("*.py")} - {"__init__"}
    assert not defined & modules, f"tests/support modules named like its names: {sorted(defined & modules)}"


def _test_modules_imported(tree: ast.Module) -> list[str]:
    """The ``tests/**/test_*.py`` modules ``tree`` imports, anywhere in it (in a function too)."""
    return [
        name
        for name in _absolute_imports(tree)
        if name.startswith("tests.")
        and name.rpartition(".")[2].startswith("test_")
        and (REPO / f"{name.replace('.', '/')}.py").is_file()
    ]


def test_no_module_under_tests_imports_a_test_module() -> None:
    """A helper that tests of two files share lives in ``tests/support/`` (or in a ``fakes.py`` beside
    the tests of one package): imported from a ``test_*.py`` module, it drags that module's tests and
    imports along, and an edit to one test file breaks another."""
    assert _test_modules_imported(ast.parse("from tests.core.test_placement import host")) == [
        "tests.core.test_placement"
    ]
    assert _test_modules_imported(ast.parse("def f():\n    from tests.core import test_placement")) == [
        "tests.core.test_placement"
    ]
    wrong = [
        f"{path.relative_to(REPO).as_posix()} -> {name}"
        for path in sorted((REPO / "tests").rglob("*.py"))
        for name in _test_modules_imported(ast.parse(path.read_text()))
    ]
    assert not wrong, "test modules imported (move the helper to tests/support/):\n" + "\n".join(wrong)
