"""What the packages tell a user (errors, warnings, help) never sends them to a docs/ file
without saying where it is: a wheel ships no docs/ folder, so the path alone leads nowhere."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("indextts_client", "indextts_sidecar")


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _messages_naming_docs() -> list[str]:
    """Each string literal (docstrings aside; an f-string's parts joined) that names docs/*.md."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"))
            skip = _docstrings(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.JoinedStr):
                    text = "".join(
                        v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)
                    )
                    for v in node.values:
                        if isinstance(v, ast.Constant):
                            skip.add(id(v))
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                    text = node.value
                else:
                    continue
                if "docs/" in text and ".md" in text:
                    found.append(f"{relative}:{node.lineno}: {text}")
    return found


def test_messages_that_name_a_docs_file_say_it_is_in_the_source_repository() -> None:
    messages = _messages_naming_docs()
    assert messages, "the scan found no message at all: it is broken"
    assert [m for m in messages if "source repository" not in m] == []
