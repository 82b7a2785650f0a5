"""convpool/_build.py's guard against a stale torch build lock.

Torches whose cpp_extension marks a build with a plain lock file (FileBaton) wait forever on
one that a killed build left behind. _build_guard serialises convpool's builds of a directory
with an flock and removes such a file while it holds it. These tests drive the guard with a
stand-in for the cpp_extension module, so they run under any torch (the one here may lock
with FileLock, where the guard does nothing).
"""
import multiprocessing as mp
import os
import time
import types

import pytest

from convpool._build import _build_guard

fcntl = pytest.importorskip("fcntl", reason="the guard needs fcntl (POSIX)")

BATON_TORCH = types.SimpleNamespace(FileBaton=object)
FILELOCK_TORCH = types.SimpleNamespace(FileBaton=object, FileLock=object)


def test_stale_lock_is_removed(tmp_path, capsys):
    (tmp_path / "lock").write_text("")
    with _build_guard(str(tmp_path), BATON_TORCH):
        assert not (tmp_path / "lock").exists()
    assert "did not finish" in capsys.readouterr().err


def test_torch_with_an_os_lock_is_left_alone(tmp_path):
    (tmp_path / "lock").write_text("")
    with _build_guard(str(tmp_path), FILELOCK_TORCH):
        assert (tmp_path / "lock").exists()
    assert not (tmp_path / "convpool.flock").exists()


def _builder(build_dir, ready, result):
    # A live build: holds the guard, makes torch's lock file as FileBaton would, works a while,
    # and reports whether its lock file survived until it removes it itself.
    with _build_guard(build_dir, BATON_TORCH):
        lock = f"{build_dir}/lock"
        open(lock, "w").close()
        ready.set()
        time.sleep(1.0)
        try:
            open(lock).close()
            result.value = 1
        except FileNotFoundError:
            result.value = 2
        finally:
            if os.path.exists(lock):
                os.remove(lock)


def test_a_live_build_is_waited_for_not_broken(tmp_path):
    ctx = mp.get_context("spawn")
    ready, result = ctx.Event(), ctx.Value("i", 0)
    child = ctx.Process(target=_builder, args=(str(tmp_path), ready, result))
    child.start()
    try:
        assert ready.wait(60), "the builder process did not start"
        t0 = time.monotonic()
        with _build_guard(str(tmp_path), BATON_TORCH):
            waited = time.monotonic() - t0
            assert not (tmp_path / "lock").exists()
        child.join(60)
    finally:
        if child.is_alive():
            child.kill()
    assert result.value == 1, "the guard removed the lock file of a build in progress"
    assert waited > 0.5, f"the guard did not wait for the live build ({waited:.2f} s)"


def test_a_killed_build_does_not_block_the_next(tmp_path):
    # The builder dies holding the guard with its lock file in place: the kernel frees the
    # flock, and the next build removes the file instead of waiting on it.
    ctx = mp.get_context("spawn")
    ready, result = ctx.Event(), ctx.Value("i", 0)
    child = ctx.Process(target=_builder, args=(str(tmp_path), ready, result))
    child.start()
    assert ready.wait(60), "the builder process did not start"
    child.kill()
    child.join(60)
    assert (tmp_path / "lock").exists()
    t0 = time.monotonic()
    with _build_guard(str(tmp_path), BATON_TORCH):
        assert not (tmp_path / "lock").exists()
    assert time.monotonic() - t0 < 30
