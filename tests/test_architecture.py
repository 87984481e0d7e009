"""The launcher's structure, read from its source with ast: no import circle, nothing imports the command
line, the analysis imports neither the run layer nor the command line, and no module outside a backend
compares a value with a scheduler's or runtime's name."""
import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Set

from dlaunch.runtimes import RUNTIMES
from dlaunch.schedulers import BACKENDS

LAUNCHER = Path(__file__).resolve().parent.parent / "dlaunch"
BACKEND_FOLDERS = (LAUNCHER / "schedulers", LAUNCHER / "runtimes")


def module_name(path: Path) -> str:
    parts = path.relative_to(LAUNCHER.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(LAUNCHER.rglob("*.py"))}


def _type_checking_only(tree: ast.AST) -> Set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (they never run)."""
    found: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            found.update(id(child) for child in ast.walk(node))
    return found


def imported(path: Path) -> Set[str]:
    """The launcher modules `path` imports, at the top or inside a function (not for type checking only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_only(tree)
    names: Set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update("%s.%s" % (node.module, alias.name) for alias in node.names)
    return {name for name in names if name in MODULES} - {module_name(path)}


def import_graph() -> Dict[str, Set[str]]:
    return {name: imported(path) for name, path in MODULES.items()}


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One import circle (its modules in order, the first again at the end), or None."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(node: str) -> Optional[List[str]]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_the_cycle_finder_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_launcher_has_no_import_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: %s" % " -> ".join(cycle)


def test_no_module_imports_the_command_line():
    importers = sorted(name for name, imports in import_graph().items() if "dlaunch.cli" in imports)
    assert importers == [], "%s import dlaunch.cli (use dlaunch.terminal and dlaunch.runs.service)" % importers


def reached(graph: Dict[str, Set[str]], start: str) -> Set[str]:
    """Every module `start` imports, directly or through the modules it imports."""
    found: Set[str] = set()
    todo = [start]
    while todo:
        for name in graph[todo.pop()] - found:
            found.add(name)
            todo.append(name)
    return found


def test_the_analysis_imports_neither_the_run_layer_nor_the_command_line():
    """dlaunch/analysis/ is below dlaunch/runs/ and the CLI: `report` over archived metrics files loads neither."""
    graph = import_graph()
    analysis = [name for name in graph if name.split(".")[:2] == ["dlaunch", "analysis"]]
    found = {name: sorted(m for m in reached(graph, name) if m.split(".")[:2] in (["dlaunch", "runs"], ["dlaunch", "cli"],
                                                                                  ["dlaunch", "terminal"]))
             for name in analysis}
    assert len(analysis) > 5 and not any(found.values()), {name: above for name, above in found.items() if above}


def libraries_imported(paths: Iterable[Path]) -> Dict[str, Set[str]]:
    """Top-level names of the third-party modules `paths` import (at the top or inside a function) -> the files."""
    found: Dict[str, Set[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            for top in {name.split(".")[0] for name in names} - set(sys.stdlib_module_names) - {"dlaunch"}:
                found.setdefault(top, set()).add(path.relative_to(LAUNCHER.parent).as_posix())
    return found


def test_every_library_the_launcher_imports_is_a_direct_dependency():
    """pyproject.toml's `dependencies` name each library dlaunch/ outside the trainer imports (none arrives
    only because another dependency pulls it in: markdown-it-py came with rich)."""
    project = tomllib.loads((LAUNCHER.parent / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].lower().replace("_", "-") for d in project["dependencies"]}
    distributions = packages_distributions()
    launcher = [path for path in MODULES.values() if LAUNCHER / "train" not in path.parents]
    missing = {top: sorted(files) for top, files in libraries_imported(launcher).items()
               if not {d.lower().replace("_", "-") for d in distributions.get(top, [top])} & declared}
    assert not missing, "imported, not a direct dependency in pyproject.toml: %s" % missing


def _constants(node: ast.expr) -> Iterator[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for element in node.elts:
            yield from _constants(element)


def backend_name_compares(source: str, names: Set[str]) -> List[str]:
    """`x == "slurm"`, `kind in ("local", ...)`: compares of a value with a backend's name, as `line: code`.
    `none` (the runtime without a container) counts only beside a kind, container or runtime: it is also a
    value of other options (`--amp none`, `gpu_vendor = "none"`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left] + list(node.comparators)
        for side in sides:
            others = " ".join(ast.unparse(other) for other in sides if other is not side)
            for value in _constants(side):
                if value in names and (value != "none" or any(w in others for w in ("kind", "container", "runtime"))):
                    found.append("%d: %s" % (node.lineno, ast.unparse(node)))
    return found


def test_the_compare_finder_finds_compares_with_backend_names():
    source = 'a = kind == "slurm"\nb = s.kind in ("x", "local")\nc = amp == "none"\nd = site.container.kind != "none"\n'
    assert backend_name_compares(source, {"slurm", "local", "none"}) == [
        "1: kind == 'slurm'", "2: s.kind in ('x', 'local')", "4: site.container.kind != 'none'"]


def test_no_compare_with_a_scheduler_or_runtime_name_outside_its_backend():
    names = set(BACKENDS) | set(RUNTIMES)
    found = []
    for path in MODULES.values():
        if not any(folder in path.parents for folder in BACKEND_FOLDERS):
            found += ["%s:%s" % (path.relative_to(LAUNCHER.parent), line)
                      for line in backend_name_compares(path.read_text(encoding="utf-8"), names)]
    assert not found, "ask the backend (its registration, its protocol) instead:\n" + "\n".join(found)
