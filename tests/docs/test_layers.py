"""The house's layers as docs/architecture.md draws them, checked on the code's own imports: every import runs down
the order, no modules import each other in a circle, and no module outgrows one reading (450 lines).

The order is written once, here and in docs/architecture.md's table (the test checks they agree). A package's
``__init__.py`` that only hands names on is its face and may import anything of its own package."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 450

# bottom first: a layer imports only layers below it (and itself)
LAYERS = ["errors", "formats", "llamacpp", "tree", "tree_policy", "decoding", "drafts", "generation", "chat",
          "measure", "convert", "hub", "api", "bench", "server", "train", "commands"]


def _sources() -> list[Path]:
    return sorted([*(ROOT / "eagle2_local").rglob("*.py"), *(ROOT / "convert").rglob("*.py")])


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "convert":  # installed as eagle2_local.convert; imported as `convert` in a checkout
        parts = ["eagle2_local", *parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every eagle2_local module ``path`` imports, at any depth of the code (TYPE_CHECKING and function-level
    imports included: a circle through them is still a circle to a reader)."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
                if target == "convert" or target.startswith("convert."):
                    target = "eagle2_local." + target
            if target.startswith("eagle2_local"):
                out.update(f"{target}.{a.name}" if _is_module(f"{target}.{a.name}") else target for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("eagle2_local"))
    return out


_MODULES: set[str] = set()


def _is_module(name: str) -> bool:
    if not _MODULES:
        _MODULES.update(_module(p) for p in _sources())
    return name in _MODULES


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _graph() -> dict[str, set[str]]:
    return {_module(p): {t for t in _imports(p) if t != _module(p)} for p in _sources()}


def test_every_package_has_its_place_in_the_order():
    missing = {_layer(m) for m in _graph()} - set(LAYERS) - {"__init__", "data"}
    assert not missing, f"place {sorted(missing)} in LAYERS and in docs/architecture.md's table"


def test_imports_only_run_down_the_order():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = []
    for module, targets in _graph().items():
        if _layer(module) == "__init__":  # the package's own face hands on names from every layer
            continue
        for target in targets:
            if _layer(target) == "__init__":
                upward.append(f"{module} -> {target} (the package face: import the module that defines the name)")
            elif rank[_layer(target)] > rank[_layer(module)]:
                upward.append(f"{module} -> {target}")
    assert not upward, "imports running up the layers:\n" + "\n".join(sorted(upward))


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle among the modules (a package face's imports of its own submodules excepted: only a
    package has modules below it), or None."""
    edges = {m: {t for t in ts if t in graph and not t.startswith(m + ".")} for m, ts in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state and (found := visit(t)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_circles():
    found = _circle(_graph())
    assert found is None, "import circle: " + " -> ".join(found)


def test_the_circle_finder_finds_one():
    graph = {"eagle2_local.tree.a": {"eagle2_local.tree.b"}, "eagle2_local.tree.b": {"eagle2_local.tree.a"}}
    assert _circle(graph) == ["eagle2_local.tree.a", "eagle2_local.tree.b", "eagle2_local.tree.a"]


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_stay_readable(path):
    n = len(path.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(ROOT)} has {n} lines (> {MAX_LINES}): split it by concept"


def test_architecture_doc_states_the_order():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- layers -->\n(.*?)<!-- /layers -->", text, re.S)
    assert m, "docs/architecture.md lost its layer table (between <!-- layers --> markers)"
    rows = [re.findall(r"`([a-z_]+)(?:/|\.py)`", line)[0] for line in m.group(1).splitlines()
            if line.startswith("|") and re.search(r"`[a-z_]+(?:/|\.py)`", line)]
    assert rows == LAYERS[::-1], f"docs/architecture.md's layer table (top first) says {rows}"
