"""`piwork network …` and doctor's network lines, as a person types them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import trustme

from piwork.auth import KeyStore
from piwork.cli.main import main
from piwork.config import get_paths
from piwork.doctor import check_network
from piwork.net.upstream import key_name
from piwork.policy.rules import Action, Verdict
from piwork.policy.store import PolicyStore
from piwork.settings import read_settings
from tests.helpers.net import private_network_home


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "home"))
    private_network_home(monkeypatch, get_paths())


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def lookup(addresses: dict[str, list[str]]) -> object:
    return lambda host: addresses.get(host, ["151.101.0.223"])


def test_doctor_says_which_registries_resolve_privately_and_the_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    paths = get_paths()
    private = lookup({h: ["203.0.113.80"] for h in ("pypi.org", "deb.debian.org")})
    (reg,) = [c for c in check_network(paths, resolver=private) if c.name == "package registries"]  # type: ignore[arg-type]
    assert reg.warning and "deb.debian.org, pypi.org resolve to 203.0.113.80" in reg.detail
    assert reg.fix.startswith("piwork network allow-private --registries")

    code, out, _ = run(capsys, "network", "allow-private", "--registries")
    assert code == 0 and "allow private-network pypi.org (global)" in out
    rules = [r for r in PolicyStore(paths.policy_file).load() if r.action is Action.PRIVATE_NETWORK]
    assert sorted(r.pattern or "" for r in rules) == [
        "deb.debian.org", "files.pythonhosted.org", "pypi.org", "registry.npmjs.org",
    ]  # fmt: skip
    assert all(r.verdict is Verdict.ALLOW for r in rules)
    (reg,) = [c for c in check_network(paths, resolver=private) if c.name == "package registries"]  # type: ignore[arg-type]
    assert not reg.warning and "allowed for the sandbox" in reg.detail

    public = [
        c for c in check_network(paths, resolver=lookup({})) if c.name == "package registries"
    ]  # type: ignore[arg-type]
    assert not public[0].warning


def test_allow_private_refuses_wildcards_and_addresses(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("*.corp", "10.0.0.1", "http://x"):
        code, _, err = run(capsys, "network", "allow-private", bad)
        assert code == 2 and "domain name" in err, err
    code, out, _ = run(capsys, "network", "allow-private", "artifactory", "Repo.Corp.")
    assert code == 0 and "artifactory" in out and "repo.corp" in out
    code, out, _ = run(capsys, "network", "forget-private", "artifactory")
    assert code == 0 and "removed 1" in out


def test_proxy_password_goes_to_the_keyring_never_the_settings(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("s3cret-proxy-pw\n"))
    code, out, _ = run(
        capsys, "network", "proxy", "set", "http://alice@proxy.corp:3128",
        "--no-proxy", "intranet.corp", "--password-stdin",
    )  # fmt: skip
    assert code == 0, out
    paths = get_paths()
    assert "s3cret" not in paths.settings_file.read_text()
    assert read_settings(paths.settings_file)["network"]["proxy"] == {
        "url": "http://alice@proxy.corp:3128",
        "noProxy": "intranet.corp",
    }
    assert KeyStore(paths=paths).get(key_name("proxy.corp", 3128)) == "s3cret-proxy-pw"
    code, out, _ = run(capsys, "network", "show", "--json", "--no-lookup")
    shown = json.loads(out)
    assert shown["proxy"]["tunnel"]["url"] == "http://alice@proxy.corp:3128"
    assert shown["proxy"]["tunnel"]["password"] is True and "s3cret" not in out
    code, out, _ = run(capsys, "network", "show", "--no-lookup")
    assert "http://alice@proxy.corp:3128 (from piwork settings, password" in out
    assert "direct (no proxy): loopback, intranet.corp" in out

    monkeypatch.setattr("sys.stdin", io.StringIO("another\n"))
    code, _, err = run(
        capsys, "network", "proxy", "set", "http://proxy.corp:3128", "--password-stdin"
    )
    assert code == 2 and "needs a user name" in err
    code, _, err = run(capsys, "network", "proxy", "set", "ftp://x:1")
    assert code == 2 and "socks5h://" in err
    assert run(capsys, "network", "proxy", "clear")[0] == 0
    assert "url" not in read_settings(paths.settings_file)["network"].get("proxy", {})


def test_ca_add_list_rm(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ca = trustme.CA(organization_name="Corp Root")
    pem = tmp_path / "corp.crt"
    pem.write_bytes(ca.cert_pem.bytes() + ca.issue_cert("x.corp").private_key_pem.bytes())
    code, out, _ = run(capsys, "network", "ca", "add", str(pem))
    assert code == 0 and "added corp: 1 certificate(s)" in out
    assert "a private key left out" in out
    assert "Corp Root" in run(capsys, "network", "ca", "list")[1]
    code, _, err = run(capsys, "network", "ca", "rm", "nope")
    assert code == 1 and "no added CA named 'nope' (added: corp)" in err
    assert run(capsys, "network", "ca", "rm", "corp")[0] == 0
    assert "Corp Root" not in run(capsys, "network", "ca", "list")[1]
    assert run(capsys, "network", "ca", "host", "off")[0] == 0
    assert read_settings(get_paths().settings_file)["network"]["cas"] == {"useHostCas": False}


def test_mirrors_per_folder_and_the_registries_answer_covers_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = tmp_path / "proj"
    folder.mkdir()
    assert run(capsys, "network", "mirror", "set", "pypi", "https://repo.corp/pypi/simple")[0] == 0
    code, out, _ = run(
        capsys, "network", "mirror", "set", "npm", "https://npm.corp/", "--folder", str(folder)
    )
    assert code == 0 and f"for tasks on {folder}" in out
    code, out, _ = run(capsys, "network", "show", "--folder", str(folder), "--no-lookup")
    assert "pypi https://repo.corp/pypi/simple, npm https://npm.corp/" in out
    code, _, err = run(capsys, "network", "mirror", "set", "debian", "https://u:p@deb.corp/debian")
    assert code == 2 and "no user name or password" in err
    code, out, _ = run(capsys, "env", "allow-registries", "--folder", str(folder))
    assert code == 0 and "network npm.corp" in out and "network repo.corp" in out
    assert run(capsys, "network", "mirror", "rm", "npm", "--folder", str(folder))[0] == 0
    code, out, _ = run(capsys, "network", "show", "--folder", str(folder), "--no-lookup")
    assert "npm.corp" not in out and "repo.corp" in out
