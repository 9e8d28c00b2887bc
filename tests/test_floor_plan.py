"""The package's floor plan: no import circle, no import from a floor into a floor above it.

The import graph is read from the source with ``ast``, imports inside functions included (a lazy
import is still a dependency; hiding one is how circles crept in before). The floors, bottom up,
are written down here and in docs/architecture.md; a module may import modules of its own floor
or of floors below it, never above. Commands are a floor whose modules do not import each other.

Imports inside functions are allowed only where they defer something heavy or optional (torch,
transformers, tokenizers, tqdm, safetensors, gguf-py, or a module of ours whose own imports pull
one of those in), and each says why in a comment: on its own line, or once for a block of
consecutive import statements, on the line above the block or on the block's first statement.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "dflash_convert"
NAME = PACKAGE.name

# bottom up; a name is a module (``errors``) or a package (``format``: every module in it)
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("_version", "errors", "terminal", "format")),
    ("primitives", ("files", "arrays", "metadata", "encoders")),
    ("model", ("drafter", "tensor_source", "target")),
    ("readers", ("sources", "tokenizer")),
    ("writers", ("write", "write_features", "write_imatrix", "outputs", "hparams", "pipeline", "plan")),
    ("engines", ("validate", "runtime", "mix_search")),
    ("commands", ("conversion", "quantize", "migrate", "check", "inspect_gguf", "capture", "accept", "imatrix")),
    ("release", ("publish", "release_card", "upload")),  # composes commands (convert, quantize, validate, check), so it sits above them
    ("interface", ("cli", "__init__")),
)
INDEPENDENT_FLOORS = ("commands",)  # no command imports another command
# third-party modules heavy or optional enough to import only where they are used
HEAVY = ("torch", "transformers", "tokenizers", "tqdm", "safetensors", "gguf", "matplotlib", "huggingface_hub", "numba")
# a lazy import of a module of ours that pulls in nothing heavy, kept on purpose
ALLOWED_LIGHT_LAZY = {
    # PEP 562: ``import dflash_convert`` stays cheap for the light commands and child processes;
    # the API resolves on first use
    ("__init__", "conversion"),
    # the command layer: parsing a command line, a usage error and -h import nothing a command runs
    # (the tests start the program hundreds of times; each command imports what it reads when it runs)
    ("cli.handlers", "inspect_gguf"), ("cli.handlers", "sources.gguf_drafter"), ("cli.handlers", "validate.report"),
}


def module_name(path: Path, root: Path = PACKAGE) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" and len(rel.parts) > 1 else rel.parts
    return ".".join(parts) if parts else "__init__"


def package_modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _is_package(mod: str, modules: dict[str, Path]) -> bool:
    return modules[mod].name == "__init__.py"


def _resolve(mod: str, node: ast.ImportFrom | ast.Import, modules: dict[str, Path]) -> list[str]:
    """The modules of ours an import statement in ``mod`` names (``from . import x`` names x)."""
    if isinstance(node, ast.Import):
        return [n.name[len(NAME) + 1:] or "__init__" for n in node.names
                if n.name == NAME or n.name.startswith(NAME + ".")]
    if node.level == 0:
        if node.module != NAME and not (node.module or "").startswith(NAME + "."):
            return []
        base = (node.module or "")[len(NAME) + 1:].split(".") if node.module != NAME else []
    else:
        here = [] if mod == "__init__" else mod.split(".")
        if not _is_package(mod, modules):
            here = here[:-1]
        base = here[:len(here) - (node.level - 1)] + (node.module.split(".") if node.module else [])
    out = []
    target = ".".join(base) or "__init__"
    for alias in node.names:
        sub = f"{target}.{alias.name}" if target != "__init__" else alias.name
        out.append(sub if sub in modules else target)
    return [m for m in out if m in modules]


def _imports(tree: ast.AST) -> list[tuple[ast.ImportFrom | ast.Import, bool]]:
    """Every import statement with whether it sits inside a function."""
    found: list[tuple[ast.ImportFrom | ast.Import, bool]] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, in_function))
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(tree, False)
    return found


def _block_heads(tree: ast.AST) -> dict[int, ast.stmt]:
    """id of each import statement -> the first statement of its block (consecutive imports in one body)."""
    heads: dict[int, ast.stmt] = {}
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if not isinstance(body, list):
                continue
            first = None
            for stmt in body:
                if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    first = first or stmt
                    heads[id(stmt)] = first
                else:
                    first = None
    return heads


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Line numbers of imports under ``if TYPE_CHECKING:`` (no run-time dependency)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in ast.walk(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    lines.add(child.lineno)
    return lines


def import_graph(package: Path = PACKAGE) -> tuple[dict[str, set[str]], list[tuple[str, str, int, bool]], dict[str, list[str]]]:
    """(module -> modules of ours it imports, every edge as (from, to, line, lazy), module -> third-party roots)."""
    modules = package_modules(package)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    edges: list[tuple[str, str, int, bool]] = []
    third: dict[str, list[str]] = {m: [] for m in modules}
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_only(tree)
        for node, lazy in _imports(tree):
            if node.lineno in skip:
                continue
            ours = _resolve(mod, node, modules)
            for target in dict.fromkeys(ours):
                if target != mod:
                    graph[mod].add(target)
                    edges.append((mod, target, node.lineno, lazy))
            if not ours and (isinstance(node, ast.Import) or node.level == 0):
                names = [n.name for n in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                third[mod] += [n.split(".")[0] for n in names]
    return graph, edges, third


def floor_of(mod: str) -> int:
    head = mod.split(".")[0]
    for i, (_, members) in enumerate(FLOORS):
        if head in members or mod in members:
            return i
    raise AssertionError(f"module {mod} is on no floor: add it to FLOORS (and to docs/architecture.md)")


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def upward(edges: list[tuple[str, str, int, bool]]) -> list[str]:
    bad = []
    for a, b, line, lazy in edges:
        fa, fb = floor_of(a), floor_of(b)
        same_command = FLOORS[fa][0] in INDEPENDENT_FLOORS and fa == fb and a.split(".")[0] != b.split(".")[0]
        if fb > fa or same_command:
            what = "a command imports another command" if same_command else f"{FLOORS[fa][0]} -> {FLOORS[fb][0]}"
            bad.append(f"{a}:{line} imports {b} ({what}{', lazily' if lazy else ''})")
    return bad


def _closure_is_heavy(mod: str, graph: dict[str, set[str]], third: dict[str, list[str]], lazy_edges: set[tuple[str, str]]) -> bool:
    """Does importing ``mod`` (its module-level imports, transitively) pull in a heavy dependency?"""
    seen, todo = set(), [mod]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        if any(t in HEAVY for t in third[m]):
            return True
        todo += [n for n in graph[m] if (m, n) not in lazy_edges]
    return False


def lazy_import_problems(package: Path = PACKAGE) -> list[str]:
    graph, edges, third = import_graph(package)
    lazy_edges = {(a, b) for a, b, _, lazy in edges if lazy}
    modules = package_modules(package)
    problems = []
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        lines = path.read_text().splitlines()
        heads = _block_heads(tree)
        for node, lazy in _imports(tree):
            if not lazy:
                continue
            ours = [m for m in _resolve(mod, node, modules) if m != mod]
            names = [n.name for n in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            where = f"{mod}:{node.lineno}"
            if ours:
                for m in ours:
                    if (mod, m) not in ALLOWED_LIGHT_LAZY and not _closure_is_heavy(m, graph, third, lazy_edges):
                        problems.append(f"{where}: lazy import of {m}, which pulls in nothing heavy: import it at the top")
            elif isinstance(node, ast.ImportFrom) and node.level:
                continue
            elif not any(n.split(".")[0] in HEAVY for n in names):
                problems.append(f"{where}: lazy import of {', '.join(names)}: only heavy or optional dependencies are imported lazily")
            first = heads[id(node)]
            head = lines[first.lineno - 1:first.end_lineno]
            above = lines[first.lineno - 2].strip() if first.lineno >= 2 else ""
            if "#" not in lines[node.lineno - 1] and not any("#" in line for line in head) and not above.startswith("#"):
                problems.append(f"{where}: lazy import without a comment saying why")
    return list(dict.fromkeys(problems))


def test_every_module_has_a_floor():
    for mod in package_modules():
        floor_of(mod)


def test_no_import_circle():
    graph, _, _ = import_graph()
    assert circles(graph) == [], "import circles:\n" + "\n".join(" -> ".join(c) for c in circles(graph))


def test_no_import_points_up_a_floor():
    _, edges, _ = import_graph()
    bad = upward(edges)
    assert bad == [], "imports into a floor above:\n" + "\n".join(bad)


def test_lazy_imports_only_defer_heavy_dependencies_and_say_why():
    problems = lazy_import_problems()
    assert problems == [], "\n".join(problems)


def test_no_module_shadows_the_standard_library():
    stdlib = set(sys.stdlib_module_names)
    shadows = sorted(m for m in package_modules() if m.split(".")[-1] in stdlib)
    assert shadows == [], f"modules named like standard-library modules: {shadows}"


def test_the_checks_see_a_circle_and_an_upward_import(tmp_path):
    """The graph walk is real: a copy of the package with one planted lazy import fails both checks."""
    import shutil

    copy = tmp_path / NAME
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    errors = copy / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _planted():\n    from .conversion import convert  # planted\n    return convert\n")
    graph, edges, _ = import_graph(copy)
    found = circles(graph)
    assert any("errors" in c and "conversion" in c for c in found), found
    assert any(line.startswith("errors:") and "imports conversion" in line for line in upward(edges))


def test_one_comment_covers_a_block_of_lazy_imports_and_a_bare_block_fails(tmp_path):
    """A comment above a block of lazy imports covers the whole block; a block with none is reported."""
    import shutil

    copy = tmp_path / NAME
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    errors = copy / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _said():\n    # heavy: planted\n    import torch\n\n"
                      "    import tqdm\n    return torch, tqdm\n\n\ndef _bare():\n    import torch\n    import tqdm\n"
                      "    return torch, tqdm\n")
    bare = errors.read_text().splitlines().index("def _bare():") + 2
    planted = [p for p in lazy_import_problems(copy) if p.startswith("errors:")]
    assert planted == [f"errors:{bare}: lazy import without a comment saying why",
                       f"errors:{bare + 1}: lazy import without a comment saying why"], planted


if __name__ == "__main__":  # the graph, for a closing note: python tests/test_floor_plan.py
    g, e, _ = import_graph()
    print("circles:", circles(g) or "none")
    for line in upward(e) or ["upward imports: none"]:
        print(line)
    for line in lazy_import_problems() or ["lazy imports: all defer heavy dependencies, each with a reason"]:
        print(line)
