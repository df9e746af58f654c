"""Host keys against a real sshd: unknown asks, wrong is refused before login."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
from pathlib import Path

import pytest

from piwork.cli.main import main
from piwork.hosts import store
from piwork.hosts.check import run_check
from piwork.hosts.connect import (
    HostKeyMismatch,
    HostKeyUnknown,
    connect,
    fingerprint_matcher,
)
from tests.helpers.hosts import Sshd


async def test_unknown_key_is_not_trusted_without_consent(sshd: Sshd) -> None:
    host = sshd.host()
    asked = []

    def refuse(info: object) -> bool:
        asked.append(info)
        return False

    with pytest.raises(HostKeyUnknown, match=re.escape(sshd.fingerprint)):
        await connect(host, refuse)
    assert len(asked) == 1
    assert not store.known_hosts_file().exists()
    assert "Accepted publickey" not in sshd.log.read_text()


async def test_accepted_fingerprint_is_remembered(sshd: Sshd) -> None:
    host = sshd.host()
    conn = await connect(host, fingerprint_matcher(sshd.fingerprint, None))
    try:
        assert (await conn.run("echo hi", check=True)).stdout == "hi\n"
    finally:
        conn.close()
        await conn.wait_closed()
    line = store.known_hosts_file().read_text()
    assert line.startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ")
    conn = await connect(host, None)  # now known: no question
    conn.close()
    await conn.wait_closed()


async def test_wrong_fingerprint_flag_does_not_trust(sshd: Sshd) -> None:
    wrong = "SHA256:" + "A" * 43
    with pytest.raises(HostKeyUnknown):
        await connect(sshd.host(), fingerprint_matcher(wrong, None))
    assert not store.known_hosts_file().exists()


def _plant_other_key(sshd: Sshd, path: Path) -> None:
    other = sshd.dir / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    entry = " ".join(Path(f"{other}.pub").read_text().split()[:2])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"[127.0.0.1]:{sshd.port} {entry}\n")


@pytest.mark.parametrize("where", ["user", "piwork"])
async def test_wrong_key_is_refused_before_login(sshd: Sshd, where: str) -> None:
    """A known_hosts entry with another key: refused even when a prompt would say yes."""
    path = Path.home() / ".ssh" / "known_hosts" if where == "user" else store.known_hosts_file()
    _plant_other_key(sshd, path)
    with pytest.raises(HostKeyMismatch, match="NOT the one trusted"):
        await connect(sshd.host(), lambda _info: True)
    assert "Accepted publickey" not in sshd.log.read_text()
    assert not await asyncio.to_thread(Path(sshd.host().root).exists)


def test_cli_add_list_check_rm(sshd: Sshd, capsys: pytest.CaptureFixture[str]) -> None:
    target = f"{sshd.user}@127.0.0.1:{sshd.port}"
    common = ["--identity", str(sshd.user_key), "--root", str(sshd.dir / "root")]
    # Not at a terminal and no fingerprint given: refused, nothing recorded.
    assert main(["hosts", "add", "box", target, *common]) == 1
    err = capsys.readouterr().err
    assert sshd.fingerprint in err and "--host-key-fingerprint" in err
    assert store.load() == {}
    rc = main(["hosts", "add", "box", target, *common, "--host-key-fingerprint", sshd.fingerprint])
    out = capsys.readouterr().out
    assert rc in (0, 1), out  # 1 only if the check found a problem; the host is added anyway
    assert "added box" in out and "qemu" in out and "accel" in out
    assert main(["hosts", "list"]) == 0
    assert target in capsys.readouterr().out
    main(["hosts", "check", "box", "--json"])
    report = __import__("json").loads(capsys.readouterr().out)
    assert report["system"] == "Linux"
    assert report["qemu_version"].startswith("QEMU emulator version")
    assert report["accel"] in ("kvm", "tcg")
    assert int(report["mem_available_kb"]) > 0 and int(report["disk_free_kb"]) > 0
    assert main(["hosts", "add", "box", target]) == 1  # exists
    assert main(["hosts", "rm", "box"]) == 0
    assert main(["hosts", "rm", "box"]) == 1
    assert "no host named 'box'" in capsys.readouterr().err


async def test_check_says_when_sshd_refuses_channels_to_unix_sockets(sshd: Sshd) -> None:
    host = sshd.host()
    conn = await connect(host, fingerprint_matcher(sshd.fingerprint, None))
    try:
        before = await run_check(conn, host.root)
    finally:
        conn.close()
        await conn.wait_closed()
    assert before.values["ssh_streamlocal"] == "1"
    assert not any("unix sockets" in p for p in before.problems)
    config = sshd.dir / "sshd_config"
    config.write_text(
        config.read_text().replace("AllowTcpForwarding local", "AllowTcpForwarding no")
    )
    started = sshd.log.read_text().count("Server listening")
    sshd.proc.send_signal(signal.SIGHUP)  # sshd re-executes itself with the new config
    for _ in range(100):
        if sshd.log.read_text().count("Server listening") > started:
            break
        await asyncio.sleep(0.1)
    conn = await connect(host, None)
    try:
        after = await run_check(conn, host.root)
    finally:
        conn.close()
        await conn.wait_closed()
    assert after.values["ssh_streamlocal"] == "0"
    assert any("AllowStreamLocalForwarding" in p for p in after.problems)
