"""Real text to edit and to summarize, read offline from Python's own standard library.

The speculation benchmark needs prompts whose answers repeat much of the prompt
(editing code) and prompts whose answers do not (summaries). Both come from the
source files of the interpreter that runs the benchmark: function definitions for
the edit workload, long docstrings for the summaries. No model hub and no dataset
download is needed, and the choice is deterministic: the same modules in a fixed
order, the same filter, then a seeded shuffle. (Another Python version has other
source text, so `describe` records the version with the workload.)
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import keyword
import random
import sys
from dataclasses import dataclass
from pathlib import Path

# Pure-Python modules of every CPython install, read in this order (never `sorted`
# globbing: a file that one install lacks must not shift the others).
MODULES = (
    "argparse", "ast", "base64", "bisect", "calendar", "cmd", "codecs", "colorsys",
    "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime", "difflib",
    "dis", "enum", "filecmp", "fnmatch", "fractions", "ftplib", "functools", "getopt",
    "gettext", "glob", "gzip", "heapq", "hmac", "html", "inspect", "ipaddress", "json",
    "locale", "logging", "mimetypes", "netrc", "ntpath", "numbers", "operator",
    "optparse", "os", "pathlib", "pickle", "pkgutil", "platform", "plistlib", "posixpath",
    "pprint", "queue", "quopri", "random", "reprlib", "sched", "secrets", "selectors",
    "shlex", "shutil", "smtplib", "socket", "statistics", "string", "subprocess",
    "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize", "traceback",
    "types", "typing", "uuid", "warnings", "wave", "weakref", "zipfile",
)  # fmt: skip
# Functions long enough to be worth speculating on, short enough that the prompt and
# a whole copy fit the benchmark's output cap.
FUNCTION_LINES = (8, 30)
DOCSTRING_CHARS = (400, 2400)


@dataclass(frozen=True)
class SourceFunction:
    module: str
    name: str
    code: str  # dedented, as in its file
    variable: str  # a local name it assigns or takes, to be renamed


@dataclass(frozen=True)
class Docstring:
    owner: str  # module, module.Class or module.function
    text: str


def _source_path(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    origin = spec.origin if spec else None
    return Path(origin) if origin and origin.endswith(".py") else None


def _local_names(function: ast.FunctionDef) -> list[str]:
    """Names the function itself binds (arguments, then assignment targets), in order
    of first appearance: renaming one of them is an edit confined to this function."""
    names = [a.arg for a in function.args.args + function.args.kwonlyargs]
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.append(node.id)
    seen = dict.fromkeys(n for n in names if n not in ("self", "cls") and len(n) >= 3)
    return [n for n in seen if not keyword.iskeyword(n)]


def _functions_of(module: str) -> list[SourceFunction]:
    path = _source_path(module)
    if path is None:
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.FunctionDef) or node.decorator_list:
            continue
        first, last = node.lineno, node.end_lineno
        if not FUNCTION_LINES[0] <= last - first + 1 <= FUNCTION_LINES[1]:
            continue
        names = _local_names(node)
        if not names:
            continue
        code = _dedent(lines[first - 1 : last])
        found.append(SourceFunction(module, node.name, code, names[0]))
    return sorted(found, key=lambda f: (f.code.count("\n"), f.name, f.code))


def _dedent(lines: list[str]) -> str:
    indent = len(lines[0]) - len(lines[0].lstrip())
    return "\n".join(line[indent:] if line[:indent].isspace() else line for line in lines)


@functools.cache
def _function_pool() -> tuple[SourceFunction, ...]:
    # Parsing some 70 files takes a second: once per process.
    return tuple(f for module in MODULES for f in _functions_of(module))


def stdlib_functions(count: int, seed: int) -> list[SourceFunction]:
    """`count` functions of the standard library, the same ones for the same seed."""
    pool = list(_function_pool())
    random.Random(f"edit-{seed}").shuffle(pool)
    if len(pool) < count:
        raise ValueError(f"only {len(pool)} standard-library functions fit; asked for {count}")
    return pool[:count]


def docstrings(count: int, seed: int) -> list[Docstring]:
    """`count` long docstrings (prose) of the standard library's modules, classes and
    functions, the same ones for the same seed."""
    pool = list(_docstring_pool())
    random.Random(f"summarize-{seed}").shuffle(pool)
    if len(pool) < count:
        raise ValueError(f"only {len(pool)} docstrings fit; asked for {count}")
    return pool[:count]


@functools.cache
def _docstring_pool() -> tuple[Docstring, ...]:
    pool = []
    for module in MODULES:
        path = _source_path(module)
        if path is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                continue
            text = ast.get_docstring(node)
            if text and DOCSTRING_CHARS[0] <= len(text) <= DOCSTRING_CHARS[1]:
                pool.append(Docstring(f"{module}.{getattr(node, 'name', '')}".rstrip("."), text))
    return tuple(pool)


def python_version() -> str:
    return ".".join(map(str, sys.version_info[:3]))
