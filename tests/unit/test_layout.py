"""The code layout's rules (DESIGN.md), checked on the source itself so they cannot quietly erode.

- imports run one way: pages & cli -> figures -> pipelines -> ablation & probe -> stats, model, zoo,
  store -> tasks, heads, workspace, executor -> errors, results; no cycle; core never imports pages or streamlit;
- imports sit at module top, except a heavy optional import whose reason is written beside it;
- no module in core/ over 600 lines unless its docstring says why ("Long because ...");
- no function with more than 10 parameters (wide signatures take a settings dataclass).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 600
MAX_PARAMETERS = 10

# Lower number = lower layer; a module may import its own layer or any lower one.
LAYERS = [
    ("core.errors", 0), ("core.results", 0), ("core.threads", 0), ("core.choices", 0),
    ("core.tasks", 1), ("core.heads", 1), ("core.workspace", 1), ("core.executor", 1),
    ("core.stats", 2), ("core.model", 2), ("core.zoo.known", 4), ("core.zoo", 2), ("core.store", 2),
    ("core.ablation", 3), ("core.probe", 3),
    ("core.pipelines", 4),
    ("core.figures", 5),
    ("core.cli", 6), ("core.bench", 6), ("core.__main__", 6), ("pages", 6), ("app", 6),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    files = [REPO / "app.py", *sorted((REPO / "core").rglob("*.py")), *sorted((REPO / "pages").rglob("*.py"))]
    return {_module_name(path): path for path in files}


SOURCES = _sources()


def _layer(module: str) -> int | None:
    if module == "core":  # the package itself: only its version string
        return 0
    for prefix, rank in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return None


def _imports(path: Path) -> list[tuple[str, ast.AST]]:
    """(imported module, node) for every import in the file, wherever it stands."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(alias.name, node) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, node))
            out += [(f"{node.module}.{alias.name}", node) for alias in node.names
                    if f"{node.module}.{alias.name}" in SOURCES]
    return out


def _local_target(name: str) -> str | None:
    """The project module an import refers to (its longest known prefix), if any."""
    while name:
        if name in SOURCES:
            return name
        name = name.rpartition(".")[0]
    return None


def _graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    for module, path in SOURCES.items():
        graph.add_node(module)
        for name, _ in _imports(path):
            target = _local_target(name)
            if target and target != module and not module.startswith(target + "."):
                graph.add_edge(module, target)
    return graph


def test_every_module_has_a_layer():
    assert [m for m in SOURCES if _layer(m) is None] == []


def test_imports_run_one_way():
    upward = [f"{a} -> {b}" for a, b in _graph().edges if _layer(b) > _layer(a)]
    assert upward == []


def test_no_import_cycle():
    cycles = list(nx.simple_cycles(_graph()))
    assert cycles == []


def test_core_imports_neither_pages_nor_streamlit():
    bad = [f"{m}: {name}" for m, path in SOURCES.items() if m.startswith("core")
           for name, _ in _imports(path) if name.split(".")[0] in ("pages", "streamlit")]
    assert bad == []


def test_imports_inside_functions_state_their_reason():
    unexplained = []
    for module, path in SOURCES.items():
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    here, above = lines[inner.lineno - 1], lines[inner.lineno - 2]
                    if "#" not in here and not above.strip().startswith("#"):
                        unexplained.append(f"{module}:{inner.lineno}")
    assert unexplained == []


@pytest.mark.parametrize("module", sorted(m for m in SOURCES if m.startswith("core")))
def test_core_module_is_short_or_says_why(module):
    path = SOURCES[module]
    n_lines = len(path.read_text().splitlines())
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert n_lines <= MAX_LINES or "Long because" in docstring, f"{module} has {n_lines} lines"


def test_no_function_takes_more_than_ten_parameters():
    wide = []
    for module, path in SOURCES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
                names = [n for n in names if n not in ("self", "cls")]
                if len(names) > MAX_PARAMETERS:
                    wide.append(f"{module}.{node.name} ({len(names)})")
    assert wide == []
