"""The README is a front door that does not lie.

Rules held here:

1. Every file the README's "Where it happens" map names exists, and every ``module.py:function`` (or
   ``module.py:Class.method``) it names is defined in that module (read with ``ast``, not imported).
2. The README stays short: at most 650 lines.
3. Product documentation (``README.md``, ``docs/*.md``) names no issue numbers.
4. Every relative link in ``README.md`` and ``docs/*.md`` points at a file that exists.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAP_HEADING = "### Where it happens"
MAX_LINES = 650
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)

# `path/to/module.py`, optionally `:name` or `:Class.method`, inside backticks.
PY_REF = re.compile(r"`([\w./-]+\.py)(?::([\w.]+))?`")
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def map_rows() -> list[str]:
    """The body rows of the first table under the map's heading."""
    lines = README.read_text().splitlines()
    after = lines[lines.index(MAP_HEADING) :]
    first = next(i for i, line in enumerate(after) if line.startswith("|"))
    rows: list[str] = []
    for line in after[first:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows[2:]  # past the header and the separator


def defines(module: Path, name: str) -> bool:
    """Whether ``name`` (``function`` or ``Class.method``) is defined at the top of ``module``."""
    scope: list[ast.stmt] = ast.parse(module.read_text()).body
    for part in name.split("."):
        named = [node for node in scope if isinstance(node, DEFINITIONS) and node.name == part]
        if not named:
            return False
        scope = named[0].body
    return True


def test_the_map_has_a_row_per_behaviour_and_each_names_a_decision_and_its_tests() -> None:
    rows = map_rows()
    assert 12 <= len(rows) <= 15, f"{len(rows)} rows"
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == 4, row
        assert PY_REF.search(cells[1]), f"no module:function in {row}"
        assert "`tests/" in cells[3], f"no test file in {row}"


def test_every_file_and_function_the_map_names_exists() -> None:
    missing: list[str] = []
    for row in map_rows():
        for path, name in PY_REF.findall(row):
            module = ROOT / path
            if not module.is_file():
                missing.append(path)
            elif name and not defines(module, name):
                missing.append(f"{path}:{name}")
    assert not missing, f"the README's map names what does not exist: {missing}"


def test_the_readme_is_at_most_650_lines() -> None:
    assert len(README.read_text().splitlines()) <= MAX_LINES


def product_docs() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def test_product_docs_name_no_issue_numbers() -> None:
    found = [f"{doc.name}: {m.group(0)}" for doc in product_docs() for m in ISSUE.finditer(doc.read_text())]
    assert not found, found


def test_relative_links_in_product_docs_point_at_files_that_exist() -> None:
    broken: list[str] = []
    for doc in product_docs():
        for target in LINK.findall(doc.read_text()):
            if target.startswith(("http://", "https://", "mailto:", "#")):
                continue
            path = target.split("#", 1)[0]
            if not (doc.parent / path).exists():
                broken.append(f"{doc.name}: {target}")
    assert not broken, broken
