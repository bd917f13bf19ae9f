"""No tracked source file over MAX_LINES lines.

A file that long holds more than one concept; it is split along a seam (one concept a
file), not squeezed. Checked on what git tracks (.py, .c, .h; the generated gRPC code
excluded): a scratch file nobody committed is nobody's concern yet. The tracked paths
are read from git's index file, since `git ls-files` would start a process, which the
fast tier refuses (tests/tiers.py).
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

MAX_LINES = 320
SOURCE_SUFFIXES = (".py", ".c", ".h")
GENERATED = re.compile(r"_pb2(_grpc)?\.pyi?$")
ROOT = Path(__file__).resolve().parent.parent

# An index entry (formats 2 and 3, SHA-1 object ids): ctime, mtime, dev, ino, mode,
# uid, gid, size (40 bytes), the object id (20), then 16 bits of flags.
_ENTRY_FIXED = 62
_EXTENDED_FLAG = 0x4000


def git_dir(root: Path) -> Path | None:
    """The repository's git directory: .git itself, or where a .git file points (a
    worktree or a submodule); None outside a git checkout."""
    dot_git = root / ".git"
    if dot_git.is_dir():
        return dot_git
    if dot_git.is_file():
        line = dot_git.read_text().strip()
        if line.startswith("gitdir:"):
            return (root / line.removeprefix("gitdir:").strip()).resolve()
    return None


def tracked_paths(index: bytes) -> list[str]:
    """The paths an index file lists, each once (a conflicted path has an entry per
    stage). Raises ValueError for a format this does not read (4 compresses paths)."""
    signature, version, count = struct.unpack(">4sLL", index[:12])
    if signature != b"DIRC" or version not in (2, 3):
        raise ValueError(f"git index {signature!r} version {version}: only 2 and 3 are read")
    paths: dict[str, None] = {}
    at = 12
    for _ in range(count):
        (flags,) = struct.unpack(">H", index[at + _ENTRY_FIXED - 2 : at + _ENTRY_FIXED])
        path_at = at + _ENTRY_FIXED + (2 if version == 3 and flags & _EXTENDED_FLAG else 0)
        end = index.index(b"\0", path_at)
        paths[index[path_at:end].decode()] = None
        # Each entry is NUL-padded (one NUL at least) to a multiple of 8 bytes.
        at += (end - at + 8) & ~7
    return list(paths)


def source_files(paths: list[str]) -> list[str]:
    return [p for p in paths if p.endswith(SOURCE_SUFFIXES) and not GENERATED.search(p)]


def files_over(root: Path, paths: list[str], limit: int = MAX_LINES) -> dict[str, int]:
    """Each path (relative to root) with more than `limit` lines, as `wc -l` counts them;
    a path tracked but deleted in the working tree is not there to count."""
    over = {}
    for path in paths:
        file = root / path
        if file.is_file():
            num_lines = file.read_bytes().count(b"\n")
            if num_lines > limit:
                over[path] = num_lines
    return over


def test_no_tracked_source_file_is_over_the_limit():
    directory = git_dir(ROOT)
    if directory is None:
        pytest.skip("not a git checkout: nothing is tracked")
    paths = tracked_paths((directory / "index").read_bytes())
    # The reader found the files it must: it did not misparse the index.
    assert {"tests/tiers.py", "scheduler_svc/core/scheduler.py"} <= set(paths)
    over = files_over(ROOT, source_files(paths))
    listing = "\n".join(f"  {path}: {n} lines" for path, n in sorted(over.items()))
    assert not over, f"over {MAX_LINES} lines; split each along a seam:\n{listing}"


def test_the_check_names_a_file_one_line_over(tmp_path):
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "full.c").write_text("int x;\n" * MAX_LINES)
    (tmp_path / "long.md").write_text("prose\n" * (MAX_LINES + 1))
    (tmp_path / "long_pb2.py").write_text("x = 1\n" * (MAX_LINES + 1))
    paths = source_files(["long.py", "full.c", "long.md", "long_pb2.py", "deleted.h"])
    assert paths == ["long.py", "full.c", "deleted.h"]
    assert files_over(tmp_path, paths) == {"long.py": MAX_LINES + 1}


def test_the_index_reader_reads_what_git_writes():
    # Two entries as git writes them: format 3, the second with extended flags, and a
    # path listed twice (a conflict's stages) given once.
    def entry(path: bytes, extended: bool) -> bytes:
        flags = len(path) | (_EXTENDED_FLAG if extended else 0)
        head = bytes(_ENTRY_FIXED - 2) + struct.pack(">H", flags)
        head += b"\0\0" if extended else b""
        body = head + path
        return body + b"\0" * (8 - len(body) % 8)

    index = struct.pack(">4sLL", b"DIRC", 3, 3)
    index += entry(b"a/b.py", False) + entry(b"c.h", True) + entry(b"c.h", False)
    assert tracked_paths(index + bytes(20)) == ["a/b.py", "c.h"]
    with pytest.raises(ValueError, match="only 2 and 3"):
        tracked_paths(struct.pack(">4sLL", b"DIRC", 4, 0))
