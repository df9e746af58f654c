"""What the guest gets: the files in the state share, the variables, and network.sh.

network.sh (runtime-pack/workbench/) runs here under busybox sh, as in the
guest, on a scratch root that looks like the workbench's (a CA bundle, apt
sources): it installs the CAs and the Debian mirror, does nothing the second
time, and puts everything back when the host's settings are gone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import trustme

from piwork.agent.spec import GUEST_STATE
from piwork.config import repo_root
from piwork.net import cas as netcas
from piwork.net import guest
from piwork.net.config import MirrorSettings
from piwork.net.guest import GuestNetwork
from piwork.net.mirrors import MirrorError, guest_env, mirror_hosts, validate

SCRIPT = repo_root() / "runtime-pack" / "workbench" / "network.sh"
BUSYBOX = shutil.which("busybox")
SOURCES = (
    "deb http://deb.debian.org/debian bookworm main\n"
    "deb http://deb.debian.org/debian bookworm-updates main\n"
    "deb http://deb.debian.org/debian-security bookworm-security main\n"
)
PUBLIC_BUNDLE = "-----BEGIN CERTIFICATE-----\nPUBLIC\n-----END CERTIFICATE-----\n"


@pytest.fixture(scope="module")
def cas() -> tuple[netcas.CaCert, ...]:
    pems = b"".join(trustme.CA(organization_name=f"CA {i}").cert_pem.bytes() for i in (1, 2))
    return tuple(netcas.parse_certs(pems, "test")[0])


def test_the_guest_paths_are_the_agents() -> None:
    assert str(guest.GUEST_STATE) == GUEST_STATE


def test_variables_only_for_what_is_set(cas: tuple[netcas.CaCert, ...]) -> None:
    assert GuestNetwork().env() == {}
    env = GuestNetwork(
        cas,
        MirrorSettings(pypi="http://pypi.corp/simple", npm="https://npm.corp/", debian="x"),
    ).env()
    assert env == {
        "NODE_EXTRA_CA_CERTS": "/mnt/state/network/ca.pem",
        "PIP_CERT": "/etc/ssl/certs/ca-certificates.crt",
        "REQUESTS_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt",
        "PIP_INDEX_URL": "http://pypi.corp/simple",
        "PIP_TRUSTED_HOST": "pypi.corp",
        "npm_config_registry": "https://npm.corp/",
    }
    assert guest_env(MirrorSettings(pypi="https://pypi.corp/simple")) == {
        "PIP_INDEX_URL": "https://pypi.corp/simple"
    }


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://m/debian", "http:// or https://"),
        ("https://user:tok@pypi.corp/simple", "no user name or password"),
        ("http://m/debian;reboot", "no spaces, quotes"),
        ("http://m/deb ian", "no spaces, quotes"),
        ("http://m:99999/", "bad port"),
    ],
)
def test_mirror_urls_are_checked(url: str, says: str) -> None:
    with pytest.raises(MirrorError, match=says):
        validate("debian", url)


def test_mirror_hosts() -> None:
    m = MirrorSettings(pypi="https://Repo.corp/pypi/simple", npm="https://repo.corp/npm/")
    assert mirror_hosts(m) == ["repo.corp"]


def test_files_are_written_beneath_the_share_never_through_a_link(
    cas: tuple[netcas.CaCert, ...], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (state / "network").symlink_to(outside)  # planted by the guest
    net = GuestNetwork(cas, MirrorSettings(debian="http://debian.corp/debian"))
    assert net.write(state) is True
    assert not (state / "network").is_symlink()
    assert (state / "network" / "ca.pem").read_bytes() == netcas.bundle(cas)
    assert (state / "network" / "debian-mirror").read_text() == "http://debian.corp/debian\n"
    assert list(outside.iterdir()) == []
    assert b"PRIVATE" not in (state / "network" / "ca.pem").read_bytes()
    assert GuestNetwork().write(state) is False
    assert list((state / "network").iterdir()) == []


def run_script(root: Path, net: Path) -> None:
    assert BUSYBOX is not None, "busybox is in scripts/apt-packages.txt"
    out = subprocess.run(
        [BUSYBOX, "sh", str(SCRIPT), str(root), str(net)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"]},
        check=False,
    )
    assert out.returncode == 0, out.stderr


def fake_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "etc/ssl/certs").mkdir(parents=True)
    (root / "etc/apt/sources.list.d").mkdir(parents=True)
    (root / "etc/ssl/certs/ca-certificates.crt").write_text(PUBLIC_BUNDLE)
    (root / "etc/apt/sources.list").write_text(SOURCES)
    (root / "etc/apt/sources.list.d/extra.list").write_text(
        "deb http://deb.debian.org/debian-debug bookworm-debug main\n"
        "deb http://example.org/debian bookworm main\n"
    )
    return root


def test_network_sh_installs_keeps_and_takes_back(
    cas: tuple[netcas.CaCert, ...], tmp_path: Path
) -> None:
    root = fake_root(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    bundle = root / "etc/ssl/certs/ca-certificates.crt"
    GuestNetwork(cas, MirrorSettings(debian="http://debian.corp/debian")).write(state)
    run_script(root, state / "network")

    text = bundle.read_text()
    assert text.startswith(PUBLIC_BUNDLE) and text.count("BEGIN CERTIFICATE") == 3
    local = root / "usr/local/share/ca-certificates/piwork"
    assert sorted(p.name for p in local.glob("*.crt")) == ["piwork-1.crt", "piwork-2.crt"]
    assert (local / "piwork-1.crt").read_text() == cas[0].pem
    assert (root / "etc/apt/sources.list").read_text() == SOURCES.replace(
        "http://deb.debian.org/debian", "http://debian.corp/debian"
    )
    extra = (root / "etc/apt/sources.list.d/extra.list").read_text()
    assert "http://debian.corp/debian-debug" in extra and "http://example.org/debian " in extra

    # the same settings again: nothing is written (the folder's environment stays as it was)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
    run_script(root, state / "network")
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()} == before

    # one CA less and another mirror
    GuestNetwork(cas[:1], MirrorSettings(debian="https://mirror.corp/deb")).write(state)
    run_script(root, state / "network")
    assert bundle.read_text().count("BEGIN CERTIFICATE") == 2
    assert [p.name for p in local.glob("*.crt")] == ["piwork-1.crt"]
    assert (
        "https://mirror.corp/deb-security bookworm-security"
        in (root / "etc/apt/sources.list").read_text()
    )

    # nothing from the host any more: the root is as it was
    GuestNetwork().write(state)
    run_script(root, state / "network")
    assert bundle.read_text() == PUBLIC_BUNDLE
    assert (root / "etc/apt/sources.list").read_text() == SOURCES
    assert not local.exists()


def test_network_sh_ignores_a_mirror_line_that_is_not_a_plain_url(tmp_path: Path) -> None:
    """The guest can write the file; the script must still only ever put a URL in sed."""
    root = fake_root(tmp_path)
    net = tmp_path / "net"
    net.mkdir()
    marker = tmp_path / "ran"
    (net / "debian-mirror").write_text(f"http://x/debian|e touch {marker}|\n")
    run_script(root, net)
    assert not marker.exists()
    assert (root / "etc/apt/sources.list").read_text() == SOURCES


def test_network_sh_with_no_store_makes_one(cas: tuple[netcas.CaCert, ...], tmp_path: Path) -> None:
    """An imported image without a CA store still gets the extra CAs where PIP_CERT points."""
    root = tmp_path / "root"
    root.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    GuestNetwork(cas).write(state)
    run_script(root, state / "network")
    assert (root / "etc/ssl/certs/ca-certificates.crt").read_text().count("BEGIN CERT") == 2
