"""dlaunch's structure, read from its source with ast: layers without a circle (every import counts, at the top,
inside a function or for type checking only), the trainer apart, nothing below the command line imports it, and no
module outside a backend compares a value with a scheduler's or runtime's name."""
import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Set

from dlaunch.runtimes import RUNTIMES
from dlaunch.schedulers import SCHEDULERS

LAUNCHER = Path(__file__).resolve().parent.parent / "dlaunch"
BACKEND_FOLDERS = (LAUNCHER / "schedulers", LAUNCHER / "runtimes")

# The layers, lowest first (docs/ARCHITECTURE.md draws them): a module imports only from its own layer or lower
# ones. A module's layer is that of the first path here it lies at or below (relative to dlaunch/).
LAYERS = (
    ("train", ("train/",)),  # the trainer: imports nothing else of dlaunch
    ("base", ("errors.py", "atomic.py", "paths.py", "boundary.py", "tables.py", "thresholds.py", "version.py")),
    ("specs", ("specs/",)),  # the job's building blocks: the neutral job, its script lines, the profiles' parts
    ("backends", ("schedulers/", "runtimes/")),  # the schedulers and container runtimes
    ("jobs", ("jobs/",)),  # making a job: profile + request -> plan -> script
    ("analysis", ("analysis/",)),  # metrics files -> figures, the performance model
    ("resultsdb", ("resultsdb/",)),  # the results database, comparisons
    ("reporting", ("reporting/",)),  # report.md, report.html, plots
    ("runs", ("runs/", "preflight.py")),  # after submission: the run service, studies; doctor's checks
    ("api", ("api/", "__init__.py")),  # the Python API, and the package exposing it
    ("cli", ("cli/",)),  # the command line
)


def module_name(path: Path) -> str:
    parts = path.relative_to(LAUNCHER.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(LAUNCHER.rglob("*.py"))}


def layer_of(path: Path) -> Optional[int]:
    """The index in LAYERS of the module at `path` (None: in no layer)."""
    relative = path.relative_to(LAUNCHER).as_posix()
    for index, (_, places) in enumerate(LAYERS):
        if any(relative == place or (place.endswith("/") and relative.startswith(place)) for place in places):
            return index
    return None


def imported_names(tree: ast.AST) -> Set[str]:
    """The absolute module names an ast imports, wherever the import stands: `from P import M` names P.M (and P
    too when some name it takes is not a module of P)."""
    names: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            taken = ["%s.%s" % (node.module, alias.name) for alias in node.names]
            names.update(name for name in taken if name in MODULES)
            if any(name not in MODULES for name in taken):
                names.add(node.module)
    return names


def imported(path: Path) -> Set[str]:
    """The dlaunch modules `path` imports: at the top, inside a function, under `if TYPE_CHECKING:`."""
    names = imported_names(ast.parse(path.read_text(encoding="utf-8")))
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


def test_imports_inside_functions_and_for_type_checking_count():
    tree = ast.parse("import typing\nif typing.TYPE_CHECKING:\n    from dlaunch.api import Job\n"
                     "def f():\n    from dlaunch import api, errors\n    import dlaunch.launch\n")
    assert imported_names(tree) == {"typing", "dlaunch.api", "dlaunch.errors", "dlaunch.launch"}


def test_dlaunch_has_no_import_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: %s" % " -> ".join(cycle)


def test_every_module_has_a_layer():
    assert [name for name, path in MODULES.items() if layer_of(path) is None] == [], "add them to LAYERS"


def layer_breaches(graph: Dict[str, Set[str]]) -> List[str]:
    """`a (layer) imports b (higher layer)` for every import of a module from a layer above its own."""
    found = []
    for name, imports in sorted(graph.items()):
        own = layer_of(MODULES[name])
        for other in sorted(imports):
            theirs = layer_of(MODULES[other])
            if own is not None and theirs is not None and theirs > own:
                found.append("%s (%s) imports %s (%s)" % (name, LAYERS[own][0], other, LAYERS[theirs][0]))
    return found


def test_an_import_from_a_higher_layer_is_found():
    """The backends stand under the job layer: a scheduler that imports the plan breaks the table."""
    graph = {"dlaunch.schedulers.slurm": {"dlaunch.jobs.plan", "dlaunch.specs.job"}, "dlaunch.jobs.plan": set(),
             "dlaunch.specs.job": set()}
    assert layer_breaches(graph) == ["dlaunch.schedulers.slurm (backends) imports dlaunch.jobs.plan (jobs)"]


def test_a_module_imports_only_from_its_layer_or_lower_ones():
    breaches = layer_breaches(import_graph())
    assert breaches == [], "\n".join(breaches)


def test_the_trainer_imports_nothing_else_of_dlaunch():
    graph = import_graph()
    trainer = [name for name in graph if name.startswith("dlaunch.train")]
    found = {name: sorted(m for m in graph[name] if not m.startswith("dlaunch.train")) for name in trainer}
    assert len(trainer) > 20 and not any(found.values()), {name: others for name, others in found.items() if others}


def test_nothing_below_the_command_line_imports_it_or_typer():
    """dlaunch/cli/ parses and prints; the layers below return data (or take a `say` callable). Nothing imports the
    package's own __init__ (app, main) but its __main__."""
    graph = import_graph()
    cli = {name for name in graph if name.split(".")[:2] == ["dlaunch", "cli"]}
    importers = sorted(name for name, imports in graph.items() if name not in cli and imports & cli)
    assert importers == [], "%s import the command line (dlaunch/cli/)" % importers
    assert sorted(name for name, imports in graph.items() if "dlaunch.cli" in imports) == ["dlaunch.cli.__main__"]
    below = [path for name, path in MODULES.items() if name not in cli]
    assert {top: files for top, files in libraries_imported(below).items() if top == "typer"} == {}


def reached(graph: Dict[str, Set[str]], start: str) -> Set[str]:
    """Every module `start` imports, directly or through the modules it imports."""
    found: Set[str] = set()
    todo = [start]
    while todo:
        for name in graph[todo.pop()] - found:
            found.add(name)
            todo.append(name)
    return found


def test_the_analysis_reaches_neither_the_run_layer_nor_the_command_line():
    """dlaunch/analysis/ is below dlaunch/runs/ and the CLI: `report` over archived metrics files loads neither."""
    graph = import_graph()
    analysis = [name for name in graph if name.split(".")[:2] == ["dlaunch", "analysis"]]
    found = {name: sorted(m for m in reached(graph, name) if m.split(".")[:2] in (["dlaunch", "runs"], ["dlaunch", "cli"]))
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
    names = set(SCHEDULERS) | set(RUNTIMES)
    found = []
    for path in MODULES.values():
        if not any(folder in path.parents for folder in BACKEND_FOLDERS):
            found += ["%s:%s" % (path.relative_to(LAUNCHER.parent), line)
                      for line in backend_name_compares(path.read_text(encoding="utf-8"), names)]
    assert not found, "ask the backend (its registration, its protocol) instead:\n" + "\n".join(found)


def test_the_trainer_is_python_3_9():
    """The trainer runs in the paper's image too (Python 3.9, torch 1.11): every module of dlaunch/train parses with
    3.9's grammar, and no annotation uses `X | Y`, which 3.9 evaluates at import and refuses."""
    for path in sorted((LAUNCHER / "train").rglob("*.py")):
        tree = ast.parse(path.read_text(), feature_version=(3, 9))
        future = any(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in tree.body)
        for node in ast.walk(tree):
            annotations = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                annotations = [a.annotation for a in node.args.args + node.args.kwonlyargs] + [node.returns]
            elif isinstance(node, ast.AnnAssign):
                annotations = [node.annotation]
            for annotation in filter(None, annotations):
                unions = [n for n in ast.walk(annotation) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr)]
                assert future or not unions, "%s:%d: `X | Y` in an annotation" % (path, annotation.lineno)
