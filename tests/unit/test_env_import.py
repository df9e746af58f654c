"""``piwork env import``: archives the test writes itself (no registry), real skopeo, umoci
and mkfs.erofs; the archive's paths and modes are attacks."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from piwork.env.importer import (
    MAX_ENV_ENTRIES,
    MAX_ENV_TOTAL,
    MAX_ENV_VALUE,
    ImageSettings,
    archive_kind,
    image_settings,
    import_image,
    read_config,
    sanitize,
    unpack,
    write_settings,
)
from piwork.env.store import EnvError, EnvStore
from tests.helpers.oci_archive import busybox_image, docker_save, entry


def store(tmp_path: Path) -> EnvStore:
    return EnvStore(tmp_path / "data" / "envs", tmp_path / "data" / "tasks")


def test_an_archive_becomes_a_cached_read_only_image(tmp_path: Path) -> None:
    archive = busybox_image(tmp_path / "image.tar", b"marker\n")
    assert archive_kind(archive) == "docker-archive"
    s = store(tmp_path)
    first = import_image(s, archive)
    assert not first.cached and first.id.startswith("i-")
    assert first.path == s.image_path(first.id) and first.path.is_file()
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o400
    with first.path.open("rb") as fh:
        fh.seek(1024)
        assert fh.read(4) == bytes.fromhex("e2e1f5e0")  # erofs superblock magic
    again = import_image(s, archive)
    assert again.cached and again.id == first.id
    assert [p.name for p in s.images_dir.iterdir() if p.name.startswith("tmp-")] == []


def test_an_archive_without_a_shell_or_not_an_image_is_refused(tmp_path: Path) -> None:
    no_shell = docker_save(tmp_path / "x.tar", [[entry("etc/marker", b"x")]])
    with pytest.raises(EnvError, match="has no /bin/sh"):
        import_image(store(tmp_path), no_shell)
    plain = tmp_path / "plain.tar"
    with tarfile.open(plain, "w") as tar:
        tar.add(no_shell, arcname="something")
    with pytest.raises(EnvError, match="neither an OCI archive"):
        import_image(store(tmp_path), plain)
    (tmp_path / "text.tar").write_text("not a tar")
    with pytest.raises(EnvError, match="not a tar archive"):
        import_image(store(tmp_path), tmp_path / "text.tar")


def test_hostile_paths_stay_inside_and_special_files_and_bits_do_not_survive(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    evil = [
        entry("../../escape-dotdot", b"x"),
        entry("/abs-escape-piwork-test", b"x"),
        entry("evil", kind=tarfile.SYMTYPE, link=str(outside), mode=0o777),
        entry("evil/through-link", b"x"),
        entry("rel", kind=tarfile.SYMTYPE, link="../" * 12 + str(outside).lstrip("/")),
        entry("rel/through-rel", b"x"),
        entry("etc", kind=tarfile.DIRTYPE, mode=0o755),
        entry("etc/passwd", b"root:x:0:0::/root:/bin/sh\n"),
        entry("hl", kind=tarfile.LNKTYPE, link="/etc/passwd"),
        entry("dev", kind=tarfile.DIRTYPE, mode=0o755),
        entry("dev/mem-like", kind=tarfile.CHRTYPE),
        entry("dev/blk", kind=tarfile.BLKTYPE),
        entry("dev/fifo", kind=tarfile.FIFOTYPE),
        entry("bin", kind=tarfile.DIRTYPE, mode=0o755),
        entry("bin/suid", b"#!/bin/sh\n", mode=0o4755),
        entry("bin/sgid", b"#!/bin/sh\n", mode=0o2755),
        entry("shared", kind=tarfile.DIRTYPE, mode=0o2775),
    ]
    archive = docker_save(tmp_path / "evil.tar", [evil])
    work = tmp_path / "work"
    work.mkdir()
    rootfs = unpack(archive, work)
    changed = sanitize(rootfs)
    # Nothing left the unpacked root: not by '..', an absolute name or a symlinked parent.
    assert list(outside.iterdir()) == []
    for escaped in ("/abs-escape-piwork-test", "/escape-dotdot", str(tmp_path / "escape-dotdot")):
        assert not Path(escaped).exists(), escaped
    assert (rootfs / "abs-escape-piwork-test").is_file()
    assert (rootfs / outside.relative_to("/") / "through-link").is_file()
    # A hard link to an absolute name links inside the root, not to the host's file.
    assert (rootfs / "hl").read_bytes() == b"root:x:0:0::/root:/bin/sh\n"
    # No device node, FIFO or set-uid/set-gid bit is left for the image.
    for path in rootfs.rglob("*"):
        st = path.lstat()
        assert stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)
        if not stat.S_ISLNK(st.st_mode):
            assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID), path
    assert "cleared the set-uid/set-gid bit of bin/suid" in changed
    assert "removed dev/fifo (not a file, folder or symlink)" in changed
    # umoci, rootless, makes no device: the node is an empty regular file.
    assert (rootfs / "dev" / "mem-like").stat().st_size == 0


def test_an_oci_archive_is_read_too(tmp_path: Path) -> None:
    """skopeo turns the test's docker-save file into an OCI archive; that imports the same."""
    import shutil
    import subprocess

    docker = busybox_image(tmp_path / "image.tar", b"marker\n")
    oci = tmp_path / "image-oci.tar"
    policy = tmp_path / "policy.json"
    policy.write_text('{"default": [{"type": "insecureAcceptAnything"}]}')
    skopeo = shutil.which("skopeo")
    assert skopeo is not None
    subprocess.run(
        [skopeo, "--policy", str(policy), "copy", "--quiet",
         f"docker-archive:{docker}", f"oci-archive:{oci}:test"],
        check=True,
    )  # fmt: skip
    assert archive_kind(oci) == "oci-archive"
    work = tmp_path / "work"
    work.mkdir()
    rootfs = unpack(oci, work)
    assert (rootfs / "etc" / "piwork-marker").read_bytes() == b"marker\n"
    assert (rootfs / "bin" / "sh").is_symlink()
    result = import_image(store(tmp_path), oci)
    assert result.path.is_file() and not result.cached


def test_images_nothing_uses_are_collected_after_a_grace_time(tmp_path: Path) -> None:
    import os

    s = store(tmp_path)
    folder = tmp_path / "project"
    folder.mkdir()
    imported = import_image(s, busybox_image(tmp_path / "image.tar", b"m\n"))
    meta = s.images_dir / f"{imported.id}.json"
    s.use_image(folder, imported.id)
    old = meta.stat().st_mtime - 7200
    os.utime(meta, (old, old))
    # A task on the folder runs on it: kept after the folder is reset, while the task is.
    task = tmp_path / "data" / "tasks" / "t1"
    task.mkdir(parents=True)
    env = s.prepare(task, folder, size=64 << 20)
    assert env.image == imported.path
    s.reset(folder)
    assert imported.path.is_file()
    shutil.rmtree(task)  # the task is deleted (piwork tasks rm)
    assert imported.id in s.gc()
    assert not imported.path.exists() and not meta.exists()
    # One just imported is kept whatever uses it (the import points the folder at it next).
    again = import_image(s, tmp_path / "image.tar")
    assert not again.cached and imported.id not in s.gc() and again.path.is_file()


# ------------------------------------------------------- the image's own Env and WorkingDir

HOSTILE_ENV: list[object] = [
    "PATH=/usr/local/bin:/usr/bin:/bin",
    'GREETING=it\'s "quoted" $(touch /tmp/piwork-pwned) `id` \\ $HOME',
    "EMPTY=",
    "WITH_EQ=a=b=c",
    "MULTI=line one\nline two",
    "NUL=a\x00b",
    "CR=a\rb",
    "HUGE=" + "x" * (MAX_ENV_VALUE + 1),
    "not-a-name=1",
    "1ABC=1",
    "$(id)=1",
    "=novalue",
    "JUSTTEXT",
    42,
    "http_proxy=http://corp-proxy:3128",
    "HTTPS_PROXY=http://corp-proxy:3128",
    "BASH_ENV=/tmp/evil.sh",
    "PIWORK_BUILD_ENV=1",
    "GREETING2=\x1b[31mred\x1b[0m",
    "EMPTY=last wins",
]


def test_the_image_config_is_checked_as_untrusted_input() -> None:
    s = image_settings({"Env": HOSTILE_ENV, "WorkingDir": "//srv/app/../app/"})
    env = dict(s.env)
    assert env == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "GREETING": 'it\'s "quoted" $(touch /tmp/piwork-pwned) `id` \\ $HOME',
        "EMPTY": "last wins",
        "WITH_EQ": "a=b=c",
        "GREETING2": "\x1b[31mred\x1b[0m",  # a value is the guest's business: quoted
    }
    assert s.workdir == "/srv/app"
    notes = "\n".join(s.notes)
    for why in (
        "entry 5: the value of MULTI holds a newline or NUL",
        "entry 6: the value of NUL holds a newline or NUL",
        "entry 7: the value of CR holds a newline or NUL",
        f"entry 8: the value of HUGE is longer than {MAX_ENV_VALUE}",
        "entry 9: 'not-a-name' is not a variable name",
        "entry 11: '$(id)' is not a variable name",
        "entry 12: '' is not a variable name",
        "entry 13: not NAME=VALUE",
        "entry 14: not NAME=VALUE",
        "entry 15: http_proxy is piwork's own",
        "entry 17: BASH_ENV is piwork's own",
        "entry 18: PIWORK_BUILD_ENV is piwork's own",
    ):
        assert why in notes, why
    assert "\x1b" not in notes and "\x00" not in notes  # names are shown escaped
    # Bounds: entries, the total, the WorkingDir.
    many = image_settings({"Env": [f"V{i}=x" for i in range(MAX_ENV_ENTRIES + 50)]})
    assert len(many.env) == MAX_ENV_ENTRIES and "past its first" in many.notes[0]
    big = image_settings({"Env": [f"V{i}=" + "y" * (MAX_ENV_VALUE - 10) for i in range(40)]})
    assert sum(len(k) + len(v) for k, v in big.env) <= MAX_ENV_TOTAL
    assert any("in all" in n for n in big.notes)
    controls = ("/work\x1b]52;c;Y3VybA==\x07\x1b[1A", "/w\x9bx", "/safe\u202etxt", "/a\u200bb")
    for bad in ("relative/dir", "/a\nb", "/" + "d" * 5000, 7, ["/x"], *controls):
        odd = image_settings({"WorkingDir": bad})
        assert odd.workdir is None and odd.notes and "left out the WorkingDir" in odd.notes[0]
    assert image_settings({"Env": "PATH=/bin"}).notes == ("left out the image's Env: not a list",)
    assert image_settings({}) == ImageSettings()


def _source(script: Path, names: list[str]) -> dict[str, str]:
    """What bash gets from the file (run here only to prove the quoting is exact)."""
    shown = "; ".join(f'printf "%s\\0" "${n}"' for n in names)
    out = subprocess.run(
        ["env", "-i", "bash", "-c", f'cd /; . "$1"; {shown}; printf "%s\\0" "$PWD"', "bash",
         str(script)],
        capture_output=True,
        check=True,
    ).stdout.decode()  # fmt: skip
    values = out.split("\0")[:-1]
    return dict(zip([*names, "PWD"], values, strict=True))


def test_an_imported_images_env_and_workdir_reach_its_env_file_exactly(tmp_path: Path) -> None:
    # skopeo itself refuses an Env entry that is not a string.
    config = {"Env": [e for e in HOSTILE_ENV if isinstance(e, str)], "WorkingDir": "/srv/app"}
    archive = busybox_image(
        tmp_path / "image.tar",
        b"m\n",
        config=config,
        extra=[entry("srv", kind=tarfile.DIRTYPE, mode=0o755),
               entry("srv/app", kind=tarfile.DIRTYPE, mode=0o755)],
    )  # fmt: skip
    s = store(tmp_path)
    result = import_image(s, archive)
    assert dict(result.env)["GREETING"].startswith("it's") and result.workdir == "/srv/app"
    assert any("MULTI holds a newline" in r for r in result.removed)
    # The env file inside the image itself (extracted from the erofs here, in the test).
    out = tmp_path / "extracted"
    subprocess.run(["fsck.erofs", f"--extract={out}", str(result.path)], check=True,
                   capture_output=True)  # fmt: skip
    script = out / "etc" / "piwork" / "env.sh"
    got = _source(script, ["PATH", "GREETING", "EMPTY", "WITH_EQ", "PIWORK_WORKDIR", "HUGE"])
    assert got["GREETING"] == dict(result.env)["GREETING"]
    assert got["PIWORK_WORKDIR"] == "/srv/app"
    assert "cd /srv/app 2>/dev/null" in script.read_text()  # a shell outside /mnt starts there
    assert got["EMPTY"] == "last wins" and got["WITH_EQ"] == "a=b=c" and got["HUGE"] == ""
    assert not Path("/tmp/piwork-pwned").exists()
    # A build FROM the image starts from them; a cached import says them again.
    assert s.image_settings(result.id) == (dict(result.env), "/srv/app")
    again = import_image(s, archive)
    assert again.cached and again.env == result.env and again.workdir == "/srv/app"


def test_the_env_file_is_never_written_through_a_link_the_image_planted(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.sh"
    victim.write_text("host file\n")
    config = {"Env": ["A=1"]}
    # /etc/piwork/env.sh a link to a host file: the link is replaced, the file untouched.
    linked_file = busybox_image(
        tmp_path / "a.tar",
        b"m\n",
        config=config,
        extra=[entry("etc/piwork", kind=tarfile.DIRTYPE, mode=0o755),
               entry("etc/piwork/env.sh", kind=tarfile.SYMTYPE, link=str(victim))],
    )  # fmt: skip
    work = tmp_path / "w1"
    work.mkdir()
    rootfs = unpack(linked_file, work)
    assert write_settings(rootfs, image_settings(read_config(work / "oci"))) == []
    env_sh = rootfs / "etc" / "piwork" / "env.sh"
    assert not env_sh.is_symlink() and "export A=1" in env_sh.read_text()
    assert victim.read_text() == "host file\n"
    # /etc/piwork a link to a host folder: nothing is written, and that is said.
    linked_dir = busybox_image(
        tmp_path / "b.tar",
        b"m\n",
        config=config,
        extra=[entry("etc/piwork", kind=tarfile.SYMTYPE, link=str(outside))],
    )  # fmt: skip
    work = tmp_path / "w2"
    work.mkdir()
    rootfs = unpack(linked_dir, work)
    notes = write_settings(rootfs, image_settings(read_config(work / "oci")))
    assert notes and "are not applied" in notes[0]
    assert sorted(p.name for p in outside.iterdir()) == ["victim.sh"]
    assert (rootfs / "etc" / "piwork").is_symlink()


def test_a_layout_naming_a_blob_by_a_path_or_too_large_is_refused(tmp_path: Path) -> None:
    layout = tmp_path / "oci"
    (layout / "blobs" / "sha256").mkdir(parents=True)
    secret = tmp_path / "secret.json"
    secret.write_text('{"config": {"Env": ["STOLEN=1"]}}')

    def index(digest: str) -> None:
        (layout / "index.json").write_text(
            json.dumps({"manifests": [{"digest": digest,
                        "annotations": {"org.opencontainers.image.ref.name": "piwork"}}]})
        )  # fmt: skip

    index("sha256:../../../secret.json")
    with pytest.raises(EnvError, match="not a sha256 digest"):
        read_config(layout)
    big = "a" * 64
    (layout / "blobs" / "sha256" / big).write_bytes(b" " * (2 << 20))
    index(f"sha256:{big}")
    with pytest.raises(EnvError, match="larger than"):
        read_config(layout)
    (layout / "blobs" / "sha256" / big).unlink()
    (layout / "blobs" / "sha256" / big).symlink_to(secret)
    with pytest.raises(EnvError, match="cannot be read"):
        read_config(layout)
    (layout / "index.json").write_text("[" * 100_000)
    with pytest.raises(EnvError, match="not JSON"):
        read_config(layout)


def test_env_import_prints_archive_names_and_its_workdir_inert(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 2, finding 7, as written: a FIFO whose name clears the screen and writes the
    clipboard (OSC 52), a set-uid file whose name erases the line above, and a WorkingDir
    with the same; ``piwork env import`` printed them raw."""
    from piwork.cli.main import main

    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "home"))
    osc52 = "\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGV8c2g=\x07"
    fifo = f"\x1b[2J\x1b[H\x1b]0;owned\x07{osc52}fifo"
    suid = "usr\x1b[1A\x1b[2Ksuid"
    archive = busybox_image(
        tmp_path / "evil.tar",
        b"m\n",
        config={"Env": ["PATH=/bin"], "WorkingDir": f"/work{osc52}\x1b[1A\x1b[2K"},
        extra=[
            entry(fifo, kind=tarfile.FIFOTYPE),
            entry(suid, b"#!/bin/sh\n", mode=0o4755),
            entry("bidi\u202etxt.exe", kind=tarfile.FIFOTYPE),
        ],
    )
    folder = tmp_path / "project"
    folder.mkdir()
    assert main(["env", "import", str(archive), str(folder)]) == 0
    out, err = capfd.readouterr()
    for stream in (out, err):
        assert "\x1b" not in stream and "\x07" not in stream and "\x9b" not in stream
        assert "\u202e" not in stream
    assert "removed \\x1b[2J\\x1b[H" in err  # shown, escaped: the person sees it was there
    assert "cleared the set-uid/set-gid bit of usr\\x1b[1A" in err
    assert "left out the WorkingDir" in err
    assert "WorkingDir (/)" in out or "WorkingDir" not in out
