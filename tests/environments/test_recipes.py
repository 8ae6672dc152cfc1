"""Recipes and environment settings, without building anything: what a recipe may read, what its
digest covers, which environment a task names, and the config errors a bad setting gives."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.environments.image_support import needs_podman

from harnessrl.config import resolve_relative_paths
from harnessrl.controller.base import HarnessSpec
from harnessrl.environments.config import EnvironmentConfig, is_reference
from harnessrl.environments.podman import ImageError, Podman, qualify
from harnessrl.environments.recipes import base_images, check_recipe, pin_images, recipe_digest
from harnessrl.environments.resolve import Environments
from harnessrl.errors import ConfigError


def recipe(tmp_path: Path, text: str) -> tuple[Path, Path]:
    context = tmp_path / "ctx"
    context.mkdir(exist_ok=True)
    (context / "requirements.txt").write_text("pytest==8.3.4\n")
    containerfile = context / "Containerfile"
    containerfile.write_text(text)
    return containerfile, context


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("COPY ../secret.txt /x", "../secret.txt"),
        ("ADD a/../../b.txt /x", "a/../../b.txt"),
        ('COPY ["requirements.txt", "../../etc/shadow", "/x/"]', "../../etc/shadow"),
        ("RUN --mount=type=bind,source=/etc,target=/host-etc cat /host-etc/shadow", "/etc"),
        ("RUN --mount=type=bind,src=../..,target=/up ls /up", "../.."),
    ],
)
def test_a_recipe_reading_outside_its_context_is_refused_naming_the_line(
    tmp_path: Path, line: str, shown: str
):
    containerfile, context = recipe(tmp_path, f"FROM base\nRUN true\n{line}\n")
    with pytest.raises(ImageError) as err:
        check_recipe(containerfile, context, where="task 't1' (environment 'swe/x')")
    assert "Containerfile:3: " in str(err.value) and repr(shown) in str(err.value)
    assert "task 't1'" in str(err.value) and "outside its context" in str(err.value)


def test_what_a_recipe_may_read_passes(tmp_path: Path):
    # The control: the same instructions inside the context, a download, another stage, a cache mount.
    containerfile, context = recipe(
        tmp_path,
        "FROM base AS build\nCOPY requirements.txt /x/\nCOPY ./requirements.txt /abs-is-context-root /y/\n"
        "ADD https://example.invalid/a.tar.gz /z\nFROM base\nCOPY --from=build /x /x\n"
        "RUN --mount=type=cache,target=/root/.cache pip --version \\\n    && true\n",
    )
    check_recipe(containerfile, context, where="env")
    assert base_images(containerfile) == ["base"]  # each image once


def test_the_images_a_recipe_reads_include_those_it_copies_from(tmp_path: Path):
    containerfile, _ = recipe(
        tmp_path,
        "FROM localhost/harnessrl/base:latest AS build\nFROM debian:bookworm\n"
        "COPY --from=build /a /a\nCOPY --from=0 /b /b\nCOPY --from=quay.io/x/tool:1 /t /t\n"
        "RUN --mount=type=bind,from=localhost/data:2,target=/data ls /data\n"
        "RUN --mount=type=bind,from=build,target=/b ls /b\n",
    )
    assert base_images(containerfile) == [
        "localhost/harnessrl/base:latest",
        "debian:bookworm",
        "quay.io/x/tool:1",
        "localhost/data:2",
    ]
    pinned = pin_images(
        containerfile,
        {
            "localhost/harnessrl/base:latest": "a" * 64,
            "quay.io/x/tool:1": "b" * 64,
            "localhost/data:2": "c" * 64,
        },
        {},
    ).splitlines()
    assert pinned[0] == f"FROM {'a' * 64} AS build" and pinned[1] == "FROM debian:bookworm"
    assert pinned[2:4] == ["COPY --from=build /a /a", "COPY --from=0 /b /b"]  # stages stay stages
    assert pinned[4] == f"COPY --from={'b' * 64} /t /t"
    assert pinned[5] == f"RUN --mount=type=bind,from={'c' * 64},target=/data ls /data"


def test_from_an_arg_takes_the_build_arg_then_the_default(tmp_path: Path):
    containerfile, _ = recipe(tmp_path, "ARG BASE=localhost/a:1\nARG TAG\nFROM ${BASE}\nFROM b:${TAG:-2}\n")
    assert base_images(containerfile) == ["localhost/a:1", "b:2"]
    assert base_images(containerfile, {"BASE": "localhost/c:3", "TAG": "9"}) == ["localhost/c:3", "b:9"]
    assert pin_images(containerfile, {"localhost/a:1": "d" * 64}, {}).splitlines()[2] == f"FROM {'d' * 64}"
    containerfile.write_text("ARG BASE\nFROM $BASE\n")
    with pytest.raises(ImageError, match=r"FROM on line 2 uses \$BASE, which has no value"):
        base_images(containerfile)


@pytest.mark.parametrize(
    ("short", "qualified"),
    [
        ("jyangballin/swesmith.x86_64.a_1776_b.c", "docker.io/jyangballin/swesmith.x86_64.a_1776_b.c"),
        ("foo:1", "docker.io/library/foo:1"),
        ("quay.io/someone/foo:1", "quay.io/someone/foo:1"),
        ("registry:5000/a/b", "registry:5000/a/b"),
        ("localhost/harnessrl/x:latest", "localhost/harnessrl/x:latest"),
        ("docker.io/library/debian", "docker.io/library/debian"),
        ("a" * 64, "a" * 64),
    ],
)
def test_short_names_are_qualified_by_dockers_rule(short: str, qualified: str):
    assert qualify(short) == qualified


def test_a_link_out_of_the_context_is_refused(tmp_path: Path):
    containerfile, context = recipe(tmp_path, "FROM base\nCOPY . /src\n")
    (tmp_path / "outside.txt").write_text("secret")
    (context / "data").symlink_to(tmp_path / "outside.txt")
    with pytest.raises(ImageError, match="link to .*outside the context"):
        check_recipe(containerfile, context, where="env")
    (context / "data").unlink()
    (context / "inside").symlink_to("requirements.txt")  # the control: a link within the context
    check_recipe(containerfile, context, where="env")


def test_the_digest_covers_what_the_build_reads_and_nothing_else(tmp_path: Path):
    containerfile, context = recipe(tmp_path, "FROM base\nCOPY . /src\n")
    first = recipe_digest(containerfile, context, {}, {"base": "sha256:1"})
    (context / "unrelated-mtime").write_text("x")
    second = recipe_digest(containerfile, context, {}, {"base": "sha256:1"})
    assert second != first  # a new file in the context is read by COPY .
    assert recipe_digest(containerfile, context, {}, {"base": "sha256:1"}) == second  # stable
    (context / "unrelated-mtime").touch()  # same content, new time: same digest
    assert recipe_digest(containerfile, context, {}, {"base": "sha256:1"}) == second
    assert recipe_digest(containerfile, context, {"V": "1"}, {"base": "sha256:1"}) != second  # build args
    assert recipe_digest(containerfile, context, {}, {"base": "sha256:2"}) != second  # a rebuilt base
    (context / "requirements.txt").chmod(0o600)
    assert recipe_digest(containerfile, context, {}, {"base": "sha256:1"}) != second  # modes


def test_the_digest_covers_the_context_s_folders_empty_ones_too(tmp_path: Path):
    containerfile, context = recipe(tmp_path, "FROM base\nCOPY . /src\n")
    first = recipe_digest(containerfile, context, {}, {})
    assert recipe_digest(containerfile, context, {}, {}) == first  # the control: stable
    (context / "data").mkdir()  # COPY . makes /src/data
    second = recipe_digest(containerfile, context, {}, {})
    assert second != first
    (context / "data").chmod(0o700)  # ... with this mode
    assert recipe_digest(containerfile, context, {}, {}) != second


def test_which_environment_a_task_names():
    config = EnvironmentConfig(field="image_name", images={"swe/a": {"containerfile": "/x/Containerfile"}})
    assert config.name_for({"image_name": "swe/a"}) == "swe/a"
    assert config.recipe_for("swe/a").kind == "containerfile"
    # A SWE-smith image_name that is not configured is an image reference.
    name = config.name_for({"image_name": "jyangballin/swesmith.x86_64.owner_1776_repo.abc123"})
    assert config.recipe_for(name).image == "jyangballin/swesmith.x86_64.owner_1776_repo.abc123"
    assert config.name_for({}) == "host" and config.recipe_for("host") is None  # no field: the host
    assert EnvironmentConfig(default="swe/a").name_for({"environment": ""}) == "swe/a"
    by_repo = EnvironmentConfig(field="repo", images={"pypi/toolz": {"image": "localhost/x:1"}})
    assert by_repo.name_for({"repo": "pypi/toolz"}) == "pypi/toolz"  # recipes keyed by repository
    with pytest.raises(ValueError, match="neither configured"):
        config.recipe_for("Not A Reference!")
    assert is_reference("registry.local:5000/a/b__c-d:Tag1") and not is_reference("../up")


@pytest.mark.parametrize(
    "value",
    [
        "ubuntu:22.04\n",
        "--privileged",
        "a/../../b",
        "ubuntu\x00",
        "ubuntu:\u00fc",
        "a" * 300,
        "a/b:" + "t" * 129,
    ],
)
def test_a_task_naming_no_usable_environment_is_refused_naming_its_field(value: str):
    environments = Environments(EnvironmentConfig(field="image_name"))
    task = {"task_id": "t-1", "image_name": value}
    with pytest.raises(
        ConfigError, match=r"task 't-1': harness\.environment: task field 'image_name' is "
    ) as err:
        environments.reference_for(task)  # a cluster would get it as its Job's image
    assert "\n" not in str(err.value) and len(str(err.value)) < 400
    assert not is_reference(value)
    # The control: the same places take a reference as written.
    assert environments.reference_for({**task, "image_name": "ubuntu:22.04"}) == "ubuntu:22.04"
    assert is_reference("registry.local:5000/" + "a" * 234 + ":" + "t" * 128)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"images": {"a": {}}}, "exactly one of image, containerfile or debian"),
        ({"images": {"a": {"image": "x", "containerfile": "y"}}}, "exactly one of"),
        ({"images": {"a": {"image": "Not/Valid Ref"}}}, "not an image reference"),
        ({"images": {"a": {"image": "x", "context": "/c"}}}, "context and build_args go with containerfile"),
        ({"images": {"host": {"image": "x"}}}, "not a usable environment name"),
        ({"images": {"a\n": {"image": "x"}}}, "not a usable environment name"),
        (
            {"images": {"x/../y": {"image": "x"}}},
            "image name localhost/harnessrl/x-..-y, which podman refuses",
        ),
        ({"default": "Not A Reference"}, "default: 'Not A Reference' is neither"),
        ({"images": {"a": {"debian": {"include": ["python3\n"]}}}}, "not a Debian package name"),
        ({"field": "hidden.image"}, "evaluator-only data"),
        ({"images": {"a": {"debian": {"include": ["python3; rm -rf /"]}}}}, "not a Debian package name"),
        ({"images": {"a": {"debian": {"mirror": "--setup-hook=touch /x"}}}}, "should match pattern"),
        (
            {"images": {"py/tool": {"image": "x"}, "py-tool": {"image": "y"}}},
            "'py/tool' and 'py-tool' would share the image name localhost/harnessrl/py-tool",
        ),
        ({"registry": "https://registry.example.com:5000/rl"}, "registry\n.*not a registry prefix"),
        ({"registry": "registry.example.com/RL"}, "registry\n.*not a registry prefix"),
        ({"harness": "somewhere"}, "harness"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_bad_environment_settings_are_config_errors_naming_the_field(section: dict, message: str):
    with pytest.raises(ValueError, match=message):
        HarnessSpec(command=["true"], environment=section)


def test_recipe_paths_are_the_config_files(tmp_path: Path):
    raw = {
        "harness": {
            "environment": {
                "store": "store",
                "images": {"a": {"containerfile": "images/a/Containerfile", "context": "images/a"}},
            }
        }
    }
    resolved = resolve_relative_paths(raw, tmp_path)["harness"]["environment"]
    assert resolved["store"] == str(tmp_path / "store")
    assert resolved["images"]["a"] == {
        "containerfile": str(tmp_path / "images/a/Containerfile"),
        "context": str(tmp_path / "images/a"),
    }


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('FROM base\nCOPY "requirements.txt /x\n', "env: Containerfile:2: COPY: No closing quotation"),
        ("FROM base\nADD 'requirements.txt /x\n", "env: Containerfile:2: ADD: No closing quotation"),
    ],
)
def test_an_unclosed_quote_in_copy_is_an_image_error_naming_the_line(tmp_path: Path, text: str, where: str):
    containerfile, context = recipe(tmp_path, text)
    with pytest.raises(ImageError) as err:  # was shlex's ValueError: a traceback out of images build
        check_recipe(containerfile, context, where="env")
    assert str(err.value).startswith(where)
    containerfile.write_text('FROM base\nCOPY "requirements.txt" /x\n')  # the control: closed
    check_recipe(containerfile, context, where="env")


def test_an_unclosed_quote_in_a_global_arg_is_an_image_error_naming_the_line(tmp_path: Path):
    containerfile, _ = recipe(tmp_path, "ARG A=1\nARG BASE='localhost/a:1\nFROM ${BASE}\n")
    with pytest.raises(ImageError, match=r"^ARG on line 2: No closing quotation"):
        base_images(containerfile)
    containerfile.write_text("ARG A=1\nARG BASE='localhost/a:1'\nFROM ${BASE}\n")  # the control
    assert base_images(containerfile) == ["localhost/a:1"]


@needs_podman
def test_images_build_on_a_recipe_with_an_unclosed_quote_is_one_line_and_status_2(tmp_path: Path):
    containerfile, _ = recipe(tmp_path, 'FROM base\nCOPY "requirements.txt /x\n')
    config = tmp_path / "images.toml"
    config.write_text(f'[harness.environment.images.a]\ncontainerfile = "{containerfile}"\n')
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "harnessrl",
                "images",
                "build",
                str(config),
                "--store",
                str(tmp_path / "s"),
            ],
            capture_output=True,
            text=True,
        )
    finally:  # the store's run state under /run (a tmpfs) stayed after every run
        shutil.rmtree(Podman(tmp_path / "s").runroot, ignore_errors=True)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "environment 'a': Containerfile:2: COPY: No closing quotation" in done.stderr


def test_the_digest_covers_a_context_file_whose_name_is_not_utf8(tmp_path: Path):
    containerfile, context = recipe(tmp_path, "FROM base\nCOPY . /src\n")
    first = recipe_digest(containerfile, context, {}, {})
    latin1 = os.path.join(os.fsencode(context), b"caf\xe9.txt")  # a repository's Latin-1 file name
    Path(os.fsdecode(latin1)).write_text("x")
    check_recipe(containerfile, context, where="env")
    second = recipe_digest(containerfile, context, {}, {})  # was UnicodeEncodeError: a traceback
    assert second != first and recipe_digest(containerfile, context, {}, {}) == second
    os.rename(latin1, os.path.join(os.fsencode(context), b"caf\xe8.txt"))  # another name, same content
    assert recipe_digest(containerfile, context, {}, {}) != second
    os.symlink(b"caf\xe8.txt", os.path.join(os.fsencode(context), b"link"))  # a link to it
    assert recipe_digest(containerfile, context, {}, {}) not in (first, second)


def test_good_registry_prefixes_are_taken_as_written():
    # The control of the bad registry settings above: a port and a path, a trailing slash, capitals
    # in the host name (Docker's grammar allows them there), and "" for no registry.
    for registry in ("registry.example.com:5000/rl/", "Registry.example.com/rl", "localhost:5000", ""):
        assert EnvironmentConfig(registry=registry).registry == registry


def test_a_containerfile_starting_with_a_byte_order_mark_has_its_base_read_and_pinned(tmp_path: Path):
    containerfile, _ = recipe(tmp_path, "\ufeffFROM localhost/harnessrl/base:latest\nRUN true\n")
    assert base_images(containerfile) == ["localhost/harnessrl/base:latest"]  # was []: not in the digest
    pinned = pin_images(containerfile, {"localhost/harnessrl/base:latest": "a" * 64}, {})
    assert pinned.splitlines()[0] == f"FROM {'a' * 64}"


def test_two_recipes_whose_fields_would_run_together_have_different_digests(tmp_path: Path):
    # Under the old encoding (fields one after the other, no lengths) a file "a" holding "x", the
    # header of the next entry (NUL b NUL 644 NUL) and "y" read as two files "a" = "x" and "b" = "y":
    # both recipes had one digest, so the image cached for one was used for the other.
    digests = []
    for folder, files in (
        ("one", {"a": b"x\x00b\x00644\x00y"}),
        ("two", {"a": b"x", "b": b"y"}),
    ):
        (tmp_path / folder).mkdir()
        containerfile, context = recipe(tmp_path / folder, "FROM base\nCOPY . /src\n")
        for name, content in files.items():
            (context / name).write_bytes(content)
        for path in context.iterdir():
            path.chmod(0o644)
        context.chmod(0o755)
        digests.append(recipe_digest(containerfile, context, {}, {}))
    assert digests[0] != digests[1]
    # A link and a file with the text the old encoding wrote for a link ("link:" + target), mode 777.
    containerfile, context = recipe(tmp_path / "one", "FROM base\nCOPY . /src\n")
    (context / "a").unlink()
    (context / "a").symlink_to("requirements.txt")
    as_link = recipe_digest(containerfile, context, {}, {})
    (context / "a").unlink()
    (context / "a").write_bytes(b"link:requirements.txt")
    (context / "a").chmod(0o777)
    assert recipe_digest(containerfile, context, {}, {}) != as_link


def test_images_named_on_continuation_lines_are_pinned(tmp_path: Path):
    # The digest records these images' ids (base_images joins continuation lines); pin_images read
    # only an instruction's first line and left them as tags: the build read whatever the tag named
    # then, while the record said pinned.
    containerfile, _ = recipe(
        tmp_path,
        "FROM --platform=linux/amd64 \\\n    localhost/harnessrl/base:latest AS build\n"
        "FROM debian:bookworm\n"
        "COPY \\\n  --from=quay.io/x/tool:1 /t /t\n"
        "RUN --mount=type=cache,target=/c \\\n    --mount=type=bind,from=localhost/data:2,target=/d \\\n"
        "    ls /d\n"
        "RUN true\n",
    )
    ids = {
        "localhost/harnessrl/base:latest": "a" * 64,
        "quay.io/x/tool:1": "b" * 64,
        "localhost/data:2": "c" * 64,
    }
    assert base_images(containerfile) == [*ids][:1] + ["debian:bookworm"] + [*ids][1:]
    pinned = pin_images(containerfile, ids, {}).splitlines()
    assert pinned[:2] == [f"FROM --platform=linux/amd64 {'a' * 64} AS build", ""]  # line numbers kept
    assert pinned[2] == "FROM debian:bookworm"
    assert pinned[3:5] == [f"COPY --from={'b' * 64} /t /t", ""]
    assert pinned[5].startswith("RUN --mount=type=cache,target=/c ") and pinned[6:8] == ["", ""]
    assert f"--mount=type=bind,from={'c' * 64},target=/d" in pinned[5] and pinned[5].endswith("ls /d")
    assert pinned[8] == "RUN true"
    assert not any(tag in "\n".join(pinned) for tag in ids)


def test_a_stage_named_like_an_image_stays_that_stage_when_pinned(tmp_path: Path):
    # After "AS debian", "FROM debian" and "--from=debian" read that stage (podman's rule); pinning
    # them to the image debian's id built the image on the wrong base.
    containerfile, _ = recipe(
        tmp_path,
        "FROM debian AS tools\nFROM localhost/other:1 AS debian\nFROM debian\nCOPY --from=debian /x /x\n",
    )
    assert base_images(containerfile) == ["debian", "localhost/other:1"]
    pinned = pin_images(containerfile, {"debian": "a" * 64, "localhost/other:1": "b" * 64}, {}).splitlines()
    assert pinned == [
        f"FROM {'a' * 64} AS tools",
        f"FROM {'b' * 64} AS debian",
        "FROM debian",
        "COPY --from=debian /x /x",
    ]


def test_comments_and_the_escape_directive_inside_an_instruction_are_read_as_podman_does(tmp_path: Path):
    # A comment line inside a continuation is skipped by podman, the instruction goes on: here it
    # read "#" as the base image, and the COPY's second line as no instruction at all.
    containerfile, context = recipe(
        tmp_path,
        "FROM \\\n# the base\n    localhost/base:1\nCOPY requirements.txt \\\n# why\n  ../secret.txt /x/\n",
    )
    assert base_images(containerfile) == ["localhost/base:1"]
    assert pin_images(containerfile, {"localhost/base:1": "a" * 64}, {}).splitlines()[:3] == [
        f"FROM {'a' * 64}",
        "",
        "",
    ]
    with pytest.raises(ImageError, match=r"Containerfile:4: COPY reads '\.\./secret\.txt'"):
        check_recipe(containerfile, context, where="env")
    # "# escape=`": a backtick continues a line, a backslash does not.
    containerfile.write_text(
        "# escape=`\nFROM localhost/base:1\nCOPY requirements.txt `\n  ../secret.txt /x/\n"
    )
    with pytest.raises(ImageError, match=r"Containerfile:3: COPY reads '\.\./secret\.txt'"):
        check_recipe(containerfile, context, where="env")
    containerfile.write_text(
        "FROM localhost/base:1\nCOPY requirements.txt \\\n\n  nested/ /x/\n"
    )  # the control
    check_recipe(containerfile, context, where="env")


def test_an_arg_default_may_use_the_args_before_it(tmp_path: Path):
    # podman expands "ARG BASE=${REGISTRY}/base:1" with the REGISTRY before it; here the base was
    # "${REGISTRY}/base:1" literally, and a recipe podman builds was refused (no such image).
    containerfile, _ = recipe(
        tmp_path, "ARG REGISTRY=localhost\nARG BASE=${REGISTRY}/base:1\nARG LATER=${UNSET}/x\nFROM ${BASE}\n"
    )
    assert base_images(containerfile) == ["localhost/base:1"]
    assert base_images(containerfile, {"REGISTRY": "quay.io/rl"}) == ["quay.io/rl/base:1"]
    assert pin_images(containerfile, {"localhost/base:1": "a" * 64}, {}).splitlines()[3] == f"FROM {'a' * 64}"
    containerfile.write_text("ARG LATER=${UNSET}/x\nFROM ${LATER}\n")
    with pytest.raises(ImageError, match=r"FROM on line 2 uses \$LATER, which has no value"):
        base_images(containerfile)
