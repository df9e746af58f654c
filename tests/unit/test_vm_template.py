"""Warm-start templates: what makes one usable, and every way it is refused."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from piwork.vm.accel import Accel, AccelChoice
from piwork.vm.command import Share, Transport, VmSpec
from piwork.vm.template import (
    META,
    RAM,
    STATE,
    TemplateUnavailable,
    commit,
    key_digest,
    sweep_unfinished,
    template_for,
    template_key,
    usable,
)
from tests.helpers.pack import MANIFEST, TCG


def spec(**kw: object) -> VmSpec:
    base: dict[str, object] = dict(
        pack_dir=Path("/packs/pack-1"),
        manifest=MANIFEST,
        accel=TCG,
        qmp_socket=Path("/run/q.sock"),
        console_log=Path("/logs/console.log"),
        rpc_socket=Path("/run/rpc.sock"),
        memory_mb=1,
        shares=[Share("pwstate", Path("/a")), Share("pwup", Path("/b"), readonly=True)],
    )
    base.update(kw)
    return VmSpec(**base)  # type: ignore[arg-type]


def make(
    root: Path, s: VmSpec, state: bytes = b"device state", extra: dict[str, object] | None = None
) -> Path:
    tpl = template_for(s, root)
    tmp = root / "tmp"
    tmp.mkdir(parents=True)
    (tmp / RAM).write_bytes(b"\0" * (s.memory_mb << 20))
    (tmp / STATE).write_bytes(state)
    commit(tmp, tpl, extra or {})
    return tpl.dir


def test_a_committed_template_passes_its_check_and_is_read_only(tmp_path: Path) -> None:
    d = make(tmp_path, spec())
    template_for(spec(), tmp_path).check()
    assert not (tmp_path / "tmp").exists()
    for name in (RAM, STATE):
        assert (d / name).stat().st_mode & 0o222 == 0
    assert orjson.loads((d / META).read_bytes())["key"] == template_key(spec())


def test_task_folders_and_sockets_do_not_change_the_key() -> None:
    other = spec(
        shares=[Share("pwstate", Path("/x")), Share("pwup", Path("/y"), readonly=True)],
        rpc_socket=Path("/elsewhere.sock"),
        console_log=Path("/other/console.log"),
    )
    assert key_digest(template_key(spec())) == key_digest(template_key(other))


@pytest.mark.parametrize(
    "change",
    [
        {"manifest": MANIFEST.model_copy(update={"pack_id": "pack-2"})},
        {"memory_mb": 2},
        {"cpus": 4},
        {"accel": AccelChoice(Accel.KVM, "test", ["-accel", "kvm"])},
        {"shares": [Share("pwstate", Path("/a"))]},
        {"shares": [Share("pwstate", Path("/a")), Share("pwup", Path("/b"))]},
        # The pack's read-only disk and kernel shape the device layout and guest RAM.
        {"manifest": MANIFEST.model_copy(update={"rootfs": "root.erofs"})},
        {"manifest": MANIFEST.model_copy(update={"kernel": "vmlinux"})},
        # The workbench image adds a disk and the SCSI bus the env disk is hot-plugged on.
        {"manifest": MANIFEST.model_copy(update={"workbench": "workbench.erofs"})},
    ],
)
def test_anything_a_restore_depends_on_changes_the_key(change: dict[str, object]) -> None:
    assert key_digest(template_key(spec())) != key_digest(template_key(spec(**change)))


def test_a_changed_pack_is_not_restored_from_another_packs_template(tmp_path: Path) -> None:
    d = make(tmp_path, spec())
    new = spec(manifest=MANIFEST.model_copy(update={"pack_id": "pack-2"}))
    with pytest.raises(TemplateUnavailable, match="no saved VM"):
        template_for(new, tmp_path).check()
    # Even if the directory names collided, meta.json's key decides.
    forged = replace(template_for(new, tmp_path), dir=d)
    with pytest.raises(TemplateUnavailable, match="another pack"):
        forged.check()


def test_truncated_or_corrupt_state_is_refused(tmp_path: Path) -> None:
    d = make(tmp_path, spec())
    state = d / STATE
    os.chmod(state, 0o644)
    state.write_bytes(b"device")  # truncated
    with pytest.raises(TemplateUnavailable, match="truncated"):
        template_for(spec(), tmp_path).check()
    state.write_bytes(b"device stat!")  # same size, other bytes
    with pytest.raises(TemplateUnavailable, match="corrupt"):
        template_for(spec(), tmp_path).check()


def test_missing_ram_or_unreadable_meta_is_refused(tmp_path: Path) -> None:
    d = make(tmp_path, spec())
    os.chmod(d / RAM, 0o644)
    with (d / RAM).open("r+b") as fh:
        fh.truncate(100)
    with pytest.raises(TemplateUnavailable, match="truncated"):
        template_for(spec(), tmp_path).check()
    (d / META).write_bytes(b"{not json")
    with pytest.raises(TemplateUnavailable, match="unreadable"):
        template_for(spec(), tmp_path).check()


def test_only_the_virtio_transport_is_warm_started() -> None:
    assert usable(spec()) is None
    assert usable(spec(transport=Transport.TCP, host_tcp_port=5)) is not None


def test_a_template_saved_with_a_network_card_is_never_restored(tmp_path: Path) -> None:
    """Format 1 templates had slirp's NIC; a NIC-less clone must not load one."""
    now = spec(net_socket=Path("/run/net.sock"))
    assert template_key(now)["format"] >= 2
    old_key = {**template_key(now), "format": 1}
    # An old template sits where a new one with the old key would be: not found ...
    assert key_digest(old_key) != key_digest(template_key(now))
    # ... and even under the new digest, its meta.json's key is refused.
    tpl = template_for(now, tmp_path)
    d = make(tmp_path, now)
    meta = orjson.loads((d / META).read_bytes())
    (d / META).chmod(0o600)
    (d / META).write_bytes(orjson.dumps({**meta, "key": old_key}))
    with pytest.raises(TemplateUnavailable, match="another pack"):
        tpl.check()
    # The socket's path is per run and does not change the key (nor does its
    # absence: `piwork doctor` looks the template up without one).
    assert template_key(replace(now, net_socket=Path("/x/n.sock"))) == template_key(now)
    assert template_key(replace(now, net_socket=None)) == template_key(now)


def test_what_a_killed_builder_left_is_swept_by_the_next_build(tmp_path: Path) -> None:
    """kill -9 during a build (or a discard) leaves a directory of up to a guest's RAM
    behind; the next builder of that template (holding its lock) removes it."""
    kept = make(tmp_path, spec())
    tpl = template_for(spec(), tmp_path)
    stale = [tmp_path / f"{tpl.dir.name}.tmp-4242", tmp_path / f"{tpl.dir.name}.bad-7-99"]
    other = tmp_path / f"{key_digest({'another': 'template'})}.tmp-4242"
    for d in (*stale, other):
        d.mkdir()
        (d / RAM).write_bytes(b"\0" * 4096)
    assert sorted(sweep_unfinished(tpl)) == sorted(stale)
    assert not any(d.exists() for d in stale)
    assert other.exists(), "another template's build may be under way: not ours to sweep"
    assert kept.exists()
    tpl.check()


def test_a_failed_qemu_version_probe_means_no_saved_vm_and_is_asked_again(
    tmp_path: Path,
) -> None:
    """`qemu --version` killed (or timed out): no template is keyed "unknown" (a stray
    one would be made and later matched to any QEMU); the next start asks again."""
    qemu = tmp_path / "qemu-system-test"
    qemu.write_text("#!/bin/sh\nkill -9 $$\n")  # dies before printing its version
    qemu.chmod(0o755)
    s = spec(qemu_binary=str(qemu))
    with pytest.raises(TemplateUnavailable, match="cannot tell which QEMU"):
        template_for(s, tmp_path)
    qemu.write_text("#!/bin/sh\necho 'QEMU emulator version 7.2.99'\n")
    assert template_for(s, tmp_path).key["qemu"].startswith("QEMU emulator version 7.2.99|")


@pytest.mark.parametrize(
    ("extra", "primed"),
    [
        ({"primed": ["/opt/piwork/extensions/a.ts"]}, ("/opt/piwork/extensions/a.ts",)),
        ({"primed": []}, ()),
        ({}, None),  # an unprimed saved VM: tasks run pi's main() after the restore
        ({"prime_error": "pi exited while priming"}, None),
        ({"primed": "/opt/a.ts"}, None),  # malformed: not a list of paths
        ({"primed": [1, 2]}, None),
    ],
)
def test_a_saved_vm_says_which_extensions_its_pi_was_primed_with(
    tmp_path: Path, extra: dict[str, object], primed: tuple[str, ...] | None
) -> None:
    make(tmp_path, spec(), extra=extra)
    tpl = template_for(spec(), tmp_path)
    tpl.check()
    assert tpl.primed_with() == primed
