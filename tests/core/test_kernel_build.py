"""The compiled kernels' builds: named by their source, shared by checkouts holding it."""

from pathlib import Path

import pytest

from structconv.kernels import native


@pytest.fixture
def builder(monkeypatch, tmp_path):
    """torch's builder replaced: one folder per name under tmp_path, ``load`` recorded."""
    import torch.utils.cpp_extension as ext

    calls = []

    def folder(name, verbose):
        (tmp_path / "ext" / name).mkdir(parents=True, exist_ok=True)
        return str(tmp_path / "ext" / name)

    monkeypatch.setattr(ext, "_get_build_directory", folder)
    monkeypatch.setattr(ext, "load", lambda name, sources, **kw: calls.append((name, sources))
                        or name)
    return calls


def _checkout(root: Path, text: bytes) -> Path:
    root.mkdir(parents=True)
    (root / "causal_taps.cpp").write_bytes(text)
    return root


def test_the_build_name_follows_the_source_torch_and_flags(monkeypatch):
    a = native.build_name("causal_taps", b"int x;", ["-O3"])
    assert a.startswith("structconv_causal_taps_") and a == native.build_name(
        "causal_taps", b"int x;", ["-O3"])
    assert native.build_name("causal_taps", b"int y;", ["-O3"]) != a
    assert native.build_name("causal_taps", b"int x;", ["-O3", "-mavx2"]) != a
    monkeypatch.setattr(native.torch, "__version__", "0.0.0-other")
    assert native.build_name("causal_taps", b"int x;", ["-O3"]) != a


def test_checkouts_with_the_same_source_share_one_build(builder, tmp_path, capsys):
    one = _checkout(tmp_path / "one", b"// v1\n")
    two = _checkout(tmp_path / "two", b"// v1\n")
    native._build("causal_taps", one)
    native._build("causal_taps", two)
    (n1, s1), (n2, s2) = builder
    assert n1 == n2 and s1 == s2  # the same name compiles the same file: no rebuild
    shared = Path(s1[0])
    assert shared.parent.name == n1 and shared.read_bytes() == b"// v1\n"
    assert str(one) not in s1[0] and str(two) not in s1[0]
    mtime = shared.stat().st_mtime_ns
    (shared.parent / f"{n1}.so").write_bytes(b"")
    capsys.readouterr()
    native._build("causal_taps", two)  # built: loaded silently, the copy not rewritten
    assert capsys.readouterr().err == "" and shared.stat().st_mtime_ns == mtime


def test_an_edited_source_builds_anew_and_never_loads_the_stale_build(builder, tmp_path,
                                                                       capsys):
    old = _checkout(tmp_path / "old", b"// v1\n")
    native._build("causal_taps", old)
    stale, _ = builder[-1]
    (tmp_path / "ext" / stale / f"{stale}.so").write_bytes(b"")  # the old source's build
    new = _checkout(tmp_path / "new", b"// v2\n")
    capsys.readouterr()
    native._build("causal_taps", new)
    name, sources = builder[-1]
    assert name != stale and Path(sources[0]).read_bytes() == b"// v2\n"
    assert "compiling the kernel causal_taps.cpp" in capsys.readouterr().err


def test_a_lock_left_by_a_killed_build_is_removed_not_waited_for(builder, tmp_path, capsys):
    one = _checkout(tmp_path / "one", b"// v1\n")
    name = native.build_name("causal_taps", b"// v1\n", ["-O3", "-fopenmp",
                                                         *native._vector_flags()])
    folder = tmp_path / "ext" / name
    folder.mkdir(parents=True)
    (folder / "lock").write_text("")  # torch's baton of a build killed mid-way
    native._build("causal_taps", one)
    assert builder[-1][0] == name and not (folder / "lock").exists()
    assert "left by a kernel build that was stopped" in capsys.readouterr().err


def test_a_build_waits_while_another_process_holds_the_folder(builder, tmp_path):
    import fcntl
    import threading

    one = _checkout(tmp_path / "one", b"// v1\n")
    name = native.build_name("causal_taps", b"// v1\n", ["-O3", "-fopenmp",
                                                         *native._vector_flags()])
    folder = tmp_path / "ext" / name
    folder.mkdir(parents=True)
    with open(folder / ".structconv-build.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another builder at work (flock is per open file)
        done = threading.Event()
        worker = threading.Thread(target=lambda: (native._build("causal_taps", one),
                                                  done.set()))
        worker.start()
        assert not done.wait(0.5)  # waits for the folder, does not build beside it
        fcntl.flock(held, fcntl.LOCK_UN)
    worker.join(10)
    assert done.is_set() and builder[-1][0] == name
