"""An image's tree as a sandbox root (``sandbox/rootfs.py``), on a made-up tree: which folders are
split, which links and files are left out, which variables of the image pass. Pure: no podman, no
bubblewrap (``test_image_sandbox.py`` runs the real thing)."""

from __future__ import annotations

import os
from pathlib import Path

from harnessrl.sandbox.bwrap import Layout, bwrap_argv, write_etc
from harnessrl.sandbox.rootfs import ImageRoot, image_env, resolve_inside, root_args, split_points


def make_tree(root: Path) -> Path:
    for folder in ("usr/bin", "usr/lib", "etc", "root", "opt/tool", "proc", "tmp", "home/user", "var/lib"):
        (root / folder).mkdir(parents=True)
    (root / "bin").symlink_to("usr/bin")
    (root / "usr/bin/sh").write_text("#!fake\n")
    (root / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\n")
    (root / "etc/hosts").write_text("127.0.0.1 localhost\n")
    (root / "etc/hostname").write_text("image\n")
    (root / "root/.profile").write_text("")
    (root / "work").symlink_to("/var/lib")  # an image link in the way of a host path
    os.mkfifo(root / "root/fifo")
    return root


def test_only_folders_that_need_a_new_mount_point_are_split(tmp_path: Path):
    tree = make_tree(tmp_path / "img")
    targets = {
        "/root/.pyenv/versions/3.11": "dir",  # missing in the image: /root is split
        "/etc/passwd": "file",  # exists: bound on top, /etc stays whole
        "/work/main/.venv": "dir",  # /work is a link in the image: left out, made instead
        "/tmp/x": "dir",  # the sandbox's own /tmp: nothing of the image
        "/usr/bin/sh": "dir",  # a file where a folder will be bound: left out, /usr/bin split
    }
    split, left_out = split_points(tree, targets)
    assert split == {"/", "/root", "/usr", "/usr/bin"}
    assert left_out == {"/work", "/usr/bin/sh"}

    args = root_args(ImageRoot(tree, "img"), targets)
    pairs = []  # (option, path inside)
    while args:
        width = 2 if args[0] == "--dir" else 3
        pairs.append((args[0], args[width - 1]))
        args = args[width:]
    assert ("--symlink", "/bin") in pairs  # links recreated as links
    assert ("--ro-bind", "/etc") in pairs and ("--ro-bind", "/var") in pairs  # whole, read-only
    assert ("--dir", "/root") in pairs and ("--ro-bind", "/root/.profile") in pairs  # split, entry by entry
    assert ("--dir", "/usr") in pairs and ("--ro-bind", "/usr/lib") in pairs
    assert not any(target in ("/work", "/usr/bin/sh", "/root/fifo", "/proc", "/tmp") for _, target in pairs)
    assert all(kind in ("--ro-bind", "--symlink", "--dir") for kind, _ in pairs)  # nothing writable


def test_the_sandboxs_etc_files_cover_the_images_and_ld_so_preload_is_hidden(tmp_path: Path):
    tree = make_tree(tmp_path / "img")
    (tree / "etc/ld.so.preload").write_text("/opt/tool/evil.so\n")
    etc = write_etc(tmp_path / "etc")
    layout = Layout(command=["true"], cwd=tmp_path, env={}, etc_dir=etc, root=ImageRoot(tree, "img"))
    argv = bwrap_argv(layout)
    binds = {argv[i + 2]: argv[i + 1] for i, a in enumerate(argv) if a == "--ro-bind"}
    for name in ("passwd", "group", "hosts", "hostname"):
        assert binds[f"/etc/{name}"] == str(etc / name)
    assert binds["/etc/ld.so.preload"] == str(etc / "empty") and (etc / "empty").read_text() == ""
    assert argv[argv.index("--chdir") - 2 : argv.index("--chdir")] == ["--remount-ro", "/"]
    assert "/usr" not in [argv[i + 1] for i, a in enumerate(argv) if a == "--ro-bind"]  # no host /usr


def test_host_system_paths_are_never_bound_over_an_image(tmp_path: Path):
    tree = make_tree(tmp_path / "img")
    etc = write_etc(tmp_path / "etc")
    layout = Layout(
        command=["true"],
        cwd=tmp_path,
        env={},
        etc_dir=etc,
        read_only=(Path("/usr/lib"), tmp_path / "etc"),  # a host system path and a host folder
        root=ImageRoot(tree, "img"),
    )
    argv = bwrap_argv(layout)
    sources = [argv[i + 1] for i, a in enumerate(argv) if a == "--ro-bind"]
    assert "/usr/lib" not in sources and str(tmp_path / "etc") in sources


def test_image_env_drops_what_loads_code_into_the_harness():
    root = ImageRoot(
        Path("/nonexistent"),
        "img",
        env=("PATH=/opt/conda/bin:/usr/bin", "LANG=C.UTF-8", "LD_PRELOAD=/x.so", "PYTHONPATH=/evil")
        + ("NODE_OPTIONS=--require /evil.js", "BASH_ENV=/evil.sh", "HOME=/root", "CONDA_PREFIX=/opt/conda"),
    )
    assert image_env(root) == {
        "PATH": "/opt/conda/bin:/usr/bin",
        "LANG": "C.UTF-8",
        "CONDA_PREFIX": "/opt/conda",
    }
    assert root.search_path() == "/opt/conda/bin:/usr/bin"
    assert ImageRoot(Path("/x"), "img").search_path().endswith(":/usr/bin:/sbin:/bin")  # the standard one


def test_paths_resolve_inside_the_image_never_out_of_it(tmp_path: Path):
    tree = make_tree(tmp_path / "img")
    (tree / "usr/bin/escape").symlink_to("/../../../../etc/hostname")  # absolute: the image's own /etc
    assert resolve_inside(tree, "/bin/sh") == tree / "usr/bin/sh"
    assert resolve_inside(tree, "/usr/bin/escape") == tree / "etc/hostname"
    assert resolve_inside(tree, "/nope") is None
    root = ImageRoot(tree, "img", env=("PATH=/usr/local/bin:/bin",))
    (tree / "usr/bin/sh").chmod(0o755)
    assert root.which("sh") == "/bin/sh" and root.which("python") is None
