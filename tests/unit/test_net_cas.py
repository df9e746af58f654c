"""Extra certificate authorities: found on the host, added by the person, certificates only."""

from __future__ import annotations

import ssl
from pathlib import Path

import orjson
import pytest
import trustme

from piwork.config import Paths
from piwork.net import cas as netcas


def paths_at(root: Path, settings: dict[str, object] | None = None) -> Paths:
    paths = Paths(data=root / "d", cache=root / "c", state=root / "s", config=root / "cfg")
    paths.config.mkdir(parents=True, exist_ok=True)
    paths.settings_file.write_bytes(orjson.dumps(settings or {}))
    return paths


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA(organization_name="Corp Inspecting CA")


def test_a_private_key_beside_the_certificate_is_left_out_and_said(
    ca: trustme.CA, tmp_path: Path
) -> None:
    leaf = ca.issue_cert("proxy.corp")
    mixed = tmp_path / "bundle.pem"
    mixed.write_bytes(
        leaf.private_key_pem.bytes() + ca.cert_pem.bytes() + b"-----BEGIN X509 CRL-----\nx\n"
    )
    paths = paths_at(tmp_path)
    name, certs, notes = netcas.add_ca(paths, mixed, "corp")
    assert name == "corp" and len(certs) == 1 and certs[0].is_ca
    assert any("a private key left out" in n for n in notes), notes
    kept = (netcas.added_dir(paths) / "corp.pem").read_bytes()
    assert b"PRIVATE KEY" not in kept and b"CRL" not in kept
    assert kept.count(b"BEGIN CERTIFICATE") == 1
    assert [c.fingerprint for c in netcas.added_cas(paths)] == [certs[0].fingerprint]
    assert netcas.remove_ca(paths, "corp") and not netcas.added_cas(paths)
    assert not netcas.remove_ca(paths, "corp") and not netcas.remove_ca(paths, "../x")


def test_a_file_with_no_certificate_is_refused_with_what_to_give(
    ca: trustme.CA, tmp_path: Path
) -> None:
    key_only = tmp_path / "key.pem"
    key_only.write_bytes(ca.issue_cert("x.corp").private_key_pem.bytes())
    with pytest.raises(netcas.CaError, match=r"holds no certificate.*private key left out"):
        netcas.add_ca(paths_at(tmp_path), key_only)
    with pytest.raises(netcas.CaError, match="not a readable file"):
        netcas.add_ca(paths_at(tmp_path), tmp_path / "missing.pem")
    good = tmp_path / "ok.pem"
    good.write_bytes(ca.cert_pem.bytes())
    with pytest.raises(netcas.CaError, match="name"):
        netcas.add_ca(paths_at(tmp_path), good, "bad name/..")


def test_der_is_read_too(ca: trustme.CA, tmp_path: Path) -> None:
    der = ssl.PEM_cert_to_DER_cert(ca.cert_pem.bytes().decode())
    certs, notes = netcas.parse_certs(der, "der")
    assert len(certs) == 1 and not notes and certs[0].subject == "Corp Inspecting CA"


def test_the_hosts_extra_cas_from_its_directories_and_node_extra_ca_certs(
    ca: trustme.CA, tmp_path: Path
) -> None:
    anchors = tmp_path / "anchors" / "sub"
    anchors.mkdir(parents=True)
    (anchors / "corp.crt").write_bytes(ca.cert_pem.bytes())
    (anchors / "README").write_text("not a certificate")
    other = trustme.CA(organization_name="Node Extra CA")
    node = tmp_path / "node.pem"
    node.write_bytes(other.cert_pem.bytes() + ca.cert_pem.bytes())  # a duplicate: kept once
    found = netcas.host_extra_cas(
        dirs=[str(tmp_path / "anchors"), str(tmp_path / "nope")],
        env={"NODE_EXTRA_CA_CERTS": str(node)},
        platform="linux",
    )
    assert [c.subject for c in found] == ["Corp Inspecting CA", "Node Extra CA"]
    assert found[0].source.endswith("corp.crt")


def test_this_machines_inspecting_cas_are_found() -> None:
    """This machine's network re-signs TLS with CAs the host trusts (FACTS.md): each
    one in the Debian directory is found (on a host without any, nothing is)."""
    local = Path("/usr/local/share/ca-certificates")
    found = netcas.host_extra_cas(env={})
    assert {c.source for c in found} >= {str(p) for p in local.glob("*.crt")}


def test_extra_cas_can_leave_the_hosts_out(ca: trustme.CA, tmp_path: Path) -> None:
    host = netcas.parse_certs(ca.cert_pem.bytes(), "host")[0]
    added = tmp_path / "added.pem"
    other = trustme.CA(organization_name="Added CA")
    added.write_bytes(other.cert_pem.bytes())
    on = paths_at(tmp_path / "on")
    netcas.add_ca(on, added)
    assert [c.subject for c in netcas.extra_cas(on, host=host)] == [
        "Corp Inspecting CA",
        "Added CA",
    ]
    off = paths_at(tmp_path / "off", {"network": {"cas": {"useHostCas": False}}})
    netcas.add_ca(off, added)
    assert [c.subject for c in netcas.extra_cas(off, host=host)] == ["Added CA"]


def test_the_gateways_context_trusts_the_system_and_the_extra_cas(ca: trustme.CA) -> None:
    ctx = netcas.ssl_context(netcas.parse_certs(ca.cert_pem.bytes(), "x")[0])
    subjects = [dict(x[0] for x in c["subject"]) for c in ctx.get_ca_certs()]
    assert {"organizationName": "Corp Inspecting CA"} in [
        {k: v for k, v in s.items() if k == "organizationName"} for s in subjects
    ]
    assert ctx.verify_mode is ssl.CERT_REQUIRED and ctx.check_hostname


def test_a_variable_naming_the_whole_store_adds_only_what_is_not_public(
    ca: trustme.CA, tmp_path: Path
) -> None:
    """This host sets NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt: the whole
    store is not "extra"; only what the public set lacks is."""
    public = trustme.CA(organization_name="Some Public Root")
    store = tmp_path / "store.pem"
    store.write_bytes(public.cert_pem.bytes() + ca.cert_pem.bytes())
    public_set = {c.fingerprint for c in netcas.parse_certs(public.cert_pem.bytes(), "p")[0]}
    env = {"NODE_EXTRA_CA_CERTS": str(store), "SSL_CERT_FILE": str(store)}
    found = netcas.host_extra_cas(dirs=[], env=env, platform="linux", public=public_set)
    assert [c.subject for c in found] == ["Corp Inspecting CA"]
    # with no public set to subtract, a variable naming a system store adds nothing
    assert netcas.host_extra_cas(
        dirs=[], env={"NODE_EXTRA_CA_CERTS": "/etc/ssl/certs/ca-certificates.crt"},
        platform="linux", public=False,
    ) == []  # fmt: skip
    # ... and NODE_EXTRA_CA_CERTS naming a file of extras is taken whole
    found = netcas.host_extra_cas(dirs=[], env={"NODE_EXTRA_CA_CERTS": str(store)}, public=False)
    assert len(found) == 2
