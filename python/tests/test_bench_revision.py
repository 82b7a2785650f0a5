"""bench/revision.py: the sources hash every bench banner prints names the code exactly."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import revision  # noqa: E402


def _mini_tree(tmp_path):
    for rel in ("src/a.c", "include/convpool.h", "python/convpool/x.py", "CMakeLists.txt"):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"/* {rel} */\n")
    return tmp_path


def test_hash_follows_content_and_paths_only(tmp_path):
    root = _mini_tree(tmp_path)
    h0 = revision.sources_hash(str(root))
    (root / "src" / "notes.md").write_text("not a source")
    (root / "python" / "convpool" / "__pycache__").mkdir()
    (root / "python" / "convpool" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (root / "bench").mkdir()
    (root / "bench" / "b.py").write_text("outside the hashed folders")
    assert revision.sources_hash(str(root)) == h0
    (root / "src" / "a.c").write_text("/* src/a.c */\nint x;\n")
    h1 = revision.sources_hash(str(root))
    assert h1 != h0
    (root / "src" / "a.c").rename(root / "src" / "b.c")
    assert revision.sources_hash(str(root)) not in (h0, h1)


def test_tree_hash_matches_the_commit_when_clean():
    if shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("no git checkout")
    status = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", *revision.DIRS, *revision.FILES],
                            capture_output=True, text=True, check=True).stdout
    if status.strip():
        pytest.skip("the hashed sources have uncommitted changes")
    assert revision.sources_hash() == revision.sources_hash_at("HEAD")
    assert not revision.git_word().endswith("+dirty")
