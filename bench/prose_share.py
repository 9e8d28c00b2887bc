"""How much of the package is prose: comments and docstrings as a share of all characters.

    python bench/prose_share.py [PACKAGE_DIR] [--top N]

Counts, for every .py file under the package (default dflash_convert/), the characters of its
comment tokens (`tokenize`) and of its module, class and function docstrings (`ast`, the string
literal's source span), out of all the file's characters. Prints the overall share, the share of the
N modules with the most prose, and the public definitions without a docstring: module-level
functions and classes, and methods of module-level classes, whose names do not start with `_`.
Standard library only, so it runs anywhere the package's source is.
"""

from __future__ import annotations

import argparse
import ast
import io
import tokenize
from pathlib import Path

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _docstring_nodes(tree: ast.Module) -> list[ast.Constant]:
    """The string-constant nodes that are docstrings of the module, a class or a function."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, *_DEFS)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                found.append(first.value)
    return found


def _span_chars(lines: list[str], node: ast.Constant) -> int:
    """Characters of the source span of one node (its lines' offsets are UTF-8 byte offsets)."""
    start, end = node.lineno - 1, node.end_lineno - 1
    if start == end:
        return len(lines[start].encode()[node.col_offset:node.end_col_offset].decode())
    total = len(lines[start].encode()[node.col_offset:].decode())
    total += sum(len(lines[i]) for i in range(start + 1, end))
    return total + len(lines[end].encode()[:node.end_col_offset].decode())


def _comment_chars(text: str) -> int:
    """Characters of every comment token (the `#` included)."""
    return sum(len(tok.string) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
               if tok.type == tokenize.COMMENT)


def _public_without_docstring(tree: ast.Module) -> list[str]:
    """Public module-level functions and classes, and public methods of them, that have no docstring."""
    missing = []
    for node in tree.body:
        if not isinstance(node, _DEFS) or node.name.startswith("_"):
            continue
        if ast.get_docstring(node) is None:
            missing.append(node.name)
        if isinstance(node, ast.ClassDef):
            missing += [f"{node.name}.{m.name}" for m in node.body
                        if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and not m.name.startswith("_")
                        and ast.get_docstring(m) is None]
    return missing


def _public_count(tree: ast.Module) -> int:
    """How many public definitions `_public_without_docstring` looks at."""
    count = 0
    for node in tree.body:
        if isinstance(node, _DEFS) and not node.name.startswith("_"):
            count += 1
            if isinstance(node, ast.ClassDef):
                count += sum(1 for m in node.body
                             if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and not m.name.startswith("_"))
    return count


def measure(path: Path) -> dict:
    """One file's total, comment and docstring characters, and its public definitions lacking a docstring."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, str(path))
    lines = text.splitlines(keepends=True)
    return {"total": len(text), "comments": _comment_chars(text),
            "docstrings": sum(_span_chars(lines, n) for n in _docstring_nodes(tree)),
            "public": _public_count(tree), "missing": _public_without_docstring(tree)}


def main(argv: list[str] | None = None) -> None:
    """Print the package's prose share, the top modules by prose, and the undocumented public definitions."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", default=str(Path(__file__).resolve().parent.parent / "dflash_convert"))
    parser.add_argument("--top", type=int, default=15, help="modules to list (default 15)")
    parser.add_argument("--list-missing", action="store_true", help="name every public definition without a docstring")
    args = parser.parse_args(argv)
    root = Path(args.package)
    rows = {p.relative_to(root.parent).as_posix(): measure(p) for p in sorted(root.rglob("*.py"))}
    total = sum(r["total"] for r in rows.values())
    comments = sum(r["comments"] for r in rows.values())
    docs = sum(r["docstrings"] for r in rows.values())
    public = sum(r["public"] for r in rows.values())
    missing = sum(len(r["missing"]) for r in rows.values())
    print(f"{root.name}: {len(rows)} files, {total:,} characters; prose {comments + docs:,} = "
          f"{100 * (comments + docs) / total:.1f}% (comments {100 * comments / total:.1f}%, "
          f"docstrings {100 * docs / total:.1f}%)")
    print(f"public definitions without a docstring: {missing} of {public}")
    print()
    print(f"{'module':<44} {'chars':>8} {'prose':>8} {'share':>6} {'no doc':>6}")
    top = sorted(rows.items(), key=lambda kv: -(kv[1]["comments"] + kv[1]["docstrings"]))[:args.top]
    for name, r in top:
        prose = r["comments"] + r["docstrings"]
        print(f"{name:<44} {r['total']:>8,} {prose:>8,} {100 * prose / r['total']:>5.1f}% {len(r['missing']):>6}")
    if args.list_missing:
        print()
        for name, r in rows.items():
            for d in r["missing"]:
                print(f"{name}: {d}")


if __name__ == "__main__":
    main()
