"""pi's image resizing (photon, WebAssembly) works from the pack's bundle.

Inlined into the bundle, photon's loader (``require('path').join(__dirname,
'photon_rs_bg.wasm')``) failed at import, since an ES module has no
``__dirname``, and pi silently sent images unresized. The bundle therefore
leaves ``@silvia-odwyer/photon-node`` a run-time import
(``piwork.pack.bundle.KEPT_EXTERNAL``), which Node resolves in the pack's
tree. These tests run the real pack: the guest tree (initramfs + read-only
disk) with the guest's node, natively through ``unshare --root`` as in
test_pack_codecache, the real launcher and the bundled pi in print mode
asking a scripted model (the test double for the remote LLM), which asks pi
to read a 2400x100 PNG: the picture the model receives is 2000x83.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from piwork.models.scripted import ScriptedModelServer, Text, ToolCalls, pi_provider_config, read
from piwork.pack.bundle import KEPT_EXTERNAL, check_externals
from piwork.pack.codecache import NODE_FLAGS
from piwork.pack.errors import PackError
from tests.helpers.images import images_sent, png, png_size
from tests.helpers.pack import launch

PHOTON = "@silvia-odwyer/photon-node"
PI = Path("opt/piwork/pi/node_modules/@earendil-works/pi-coding-agent")
BUNDLE = PI / "dist/core/piwork-bundle"


def test_the_bundle_imports_photon_from_the_tree_at_run_time(guest_tree: Path) -> None:
    assert PHOTON in KEPT_EXTERNAL
    bundle = {p.name: p.read_text() for p in (guest_tree / BUNDLE).glob("*.js")}
    importing = [n for n, text in bundle.items() if f'import("{PHOTON}")' in text]
    assert importing, "no part of the bundle imports photon-node"
    # photon's own loader (which reads its .wasm next to __dirname) is not inlined.
    inlined = re.compile(r"__dirname,\s*[\"']photon_rs_bg\.wasm")
    assert not [n for n, text in bundle.items() if inlined.search(text)]
    photon = guest_tree / "opt/piwork/pi/node_modules" / PHOTON
    assert (photon / "photon_rs.js").is_file() and (photon / "photon_rs_bg.wasm").is_file()


def test_the_bundled_pi_resizes_a_wide_png(guest_tree: Path) -> None:
    home = guest_tree / "tmp" / "photon-home"
    (home / "agent").mkdir(parents=True, exist_ok=True)
    (home / "wide.png").write_bytes(png(2400, 100))
    server = ScriptedModelServer([ToolCalls([read("/tmp/photon-home/wide.png")]), Text("seen")])
    server.start_in_thread()
    try:
        # The host's loopback is the same inside unshare (no network namespace).
        provider = pi_provider_config(server.base_url, "scripted")
        provider["models"][0]["input"] = ["text", "image"]
        (home / "agent" / "models.json").write_text(
            json.dumps({"providers": {"scripted": provider}})
        )
        argv = [
            "-p", "--offline", "--no-session",
            "--provider", "scripted", "--model", "scripted",
            "--no-extensions", "--no-skills", "--no-prompt-templates", "--no-themes",
            "look at wide.png",
        ]  # fmt: skip
        go: dict[str, object] = {
            "op": "go",
            "argv": argv,
            "env": {"HOME": "/tmp/photon-home", "PI_CODING_AGENT_DIR": "/tmp/photon-home/agent"},
            "cwd": "/tmp/photon-home",
        }
        _loaded, out, err = launch(guest_tree, go, b"", *NODE_FLAGS)
        requests = server.chat_requests
    finally:
        server.stop()
    assert "seen" in out, f"stdout: {out[-1000:]}\nstderr: {err[-2000:]}"
    assert len(requests) == 2
    final = requests[-1].body
    assert "[Image: original 2400x100, displayed at 2000x83." in json.dumps(final)
    pictures = images_sent(final)
    assert [png_size(p) for p in pictures] == [(2000, 83)]


def test_the_build_fails_when_photon_does_not_load_from_the_tree(
    guest_tree: Path, tmp_path: Path
) -> None:
    """The pack build's check (bundle.check_externals, run by smoke_test) with the
    guest's node, on the real tree: it passes, and fails once photon's .wasm is gone."""
    node = guest_tree / "opt/piwork/node/bin/node"
    pi = guest_tree / PI
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    check_externals(node, pi, env, tmp_path)
    wasm = guest_tree / "opt/piwork/pi/node_modules" / PHOTON / "photon_rs_bg.wasm"
    data = wasm.read_bytes()
    wasm.unlink()
    try:
        with pytest.raises(PackError, match="do not load from the pack's tree") as err:
            check_externals(node, pi, env, tmp_path)
        assert "photon_rs_bg.wasm" in str(err.value)
    finally:
        wasm.write_bytes(data)
