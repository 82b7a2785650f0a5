"""Which code a benchmark ran: the revision line every bench banner prints.

The device machine runs a copy of the working tree, where git's HEAD may be missing or stale
and a CONVPOOL_REV left in the environment has named the wrong commit (docs/bench_shapes_*
say so in their headers). So the banner carries, beside git's word, a hash of the sources
themselves: every file under include/, src/, cmake/ and python/convpool/ with a source
extension, plus CMakeLists.txt, by path and content. It names the code exactly, with or
without git, and a commit's hash can be computed here afterwards to match a banner:

  python3 bench/revision.py              # this tree: "rev 845573f, sources 1a2b3c4d5e6f"
  python3 bench/revision.py --at HEAD~2  # the sources hash of a commit (from git's objects)
"""
import argparse
import hashlib
import os
import subprocess

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DIRS = ("include", "src", "cmake", "python/convpool")
FILES = ("CMakeLists.txt",)
EXTS = (".c", ".h", ".cu", ".cuh", ".cpp", ".py", ".cmake", ".txt", ".in")


def _wanted(rel):
    return rel in FILES or (rel.startswith(tuple(d + "/" for d in DIRS)) and rel.endswith(EXTS)
                            and "__pycache__" not in rel)


def _digest(pairs):
    h = hashlib.sha256()
    for rel, data in sorted(pairs):
        h.update(rel.encode("utf-8") + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:12]


def tree_files(root=ROOT):
    """The hashed files of a directory tree, as paths relative to root with '/' separators."""
    out = [f for f in FILES if os.path.isfile(os.path.join(root, f))]
    for d in DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, d)):
            dirnames[:] = sorted(n for n in dirnames if n != "__pycache__")
            for name in filenames:
                rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
                if _wanted(rel):
                    out.append(rel)
    return out


def sources_hash(root=ROOT):
    pairs = []
    for rel in tree_files(root):
        with open(os.path.join(root, rel), "rb") as f:
            pairs.append((rel, f.read()))
    return _digest(pairs)


def _git(*args, root=ROOT, text=True):
    return subprocess.run(["git", "-C", root, *args], capture_output=True, text=text, check=True,
                          timeout=30).stdout


def sources_hash_at(rev, root=ROOT):
    """The sources hash of commit rev, from git's objects (the working tree is not read)."""
    names = _git("ls-tree", "-r", "--name-only", rev, "--", *DIRS, *FILES, root=root).split("\n")
    pairs = [(n, _git("show", f"{rev}:{n}", root=root, text=False)) for n in names if n and _wanted(n)]
    return _digest(pairs)


def git_word(root=ROOT):
    """CONVPOOL_REV when set, else git's short HEAD (+dirty when the hashed sources differ from
    it), else "no git"."""
    if os.environ.get("CONVPOOL_REV"):
        return os.environ["CONVPOOL_REV"] + " (CONVPOOL_REV)"
    try:
        head = _git("rev-parse", "--short", "HEAD", root=root).strip()
        dirty = _git("status", "--porcelain", "--", *DIRS, *FILES, root=root).strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "no git"


def revision(root=ROOT):
    """What a banner prints after "rev ": "<git's word>, sources <hash>"."""
    return f"{git_word(root)}, sources {sources_hash(root)}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--at", metavar="REV", help="print the sources hash of this commit instead")
    args = ap.parse_args()
    print(f"{args.at}: sources {sources_hash_at(args.at)}" if args.at else f"rev {revision()}")


if __name__ == "__main__":
    main()
