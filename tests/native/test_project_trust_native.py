"""Project trust with the real pi 1.x, run natively as piwork starts it (its
extensions, the agent dir's settings.json the host writes): by default the folder's
AGENTS.md, .pi/settings.json, skills, prompt templates and extensions load, and the
project extension tells the host what was loaded; with trust off none of them does,
AGENTS.md included. No VM (the same in the VM: tests/vm/test_vm_project.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piwork.models import ScriptedModelServer, Text
from piwork.pisettings import REPORT_KEY, PiSettings, parse_project_report

from .pi_native import JSON, run_piwork_pi

MARK = "piwork-agents-md-mark-5d1c"


def make_project(work: Path) -> None:
    (work / ".pi" / "extensions").mkdir(parents=True)
    (work / ".pi" / "skills" / "tidy").mkdir(parents=True)
    (work / ".pi" / "prompts").mkdir(parents=True)
    (work / "AGENTS.md").write_text(f"# Project rules\nAlways say {MARK}.\n")
    (work / ".pi" / "settings.json").write_text(json.dumps({"defaultTools": ["+codemode"]}))
    (work / ".pi" / "skills" / "tidy" / "SKILL.md").write_text(
        "---\nname: tidy\ndescription: Tidy the folder\n---\nSort the files.\n"
    )
    (work / ".pi" / "prompts" / "release.md").write_text(
        "---\ndescription: Cut a release\n---\nCut a release.\n"
    )
    (work / ".pi" / "extensions" / "hello.ts").write_text(
        "export default function (pi: any) {\n"
        '  pi.registerTool({ name: "hello_project", label: "Hello", description: "Says hello",\n'
        '    parameters: { type: "object", properties: {} },\n'
        "    async execute() {\n"
        '      return { content: [{ type: "text", text: "hi" }], details: {} };\n'
        "    } });\n"
        "}\n"
    )


def system_text(body: JSON) -> str:
    return json.dumps([m for m in body["messages"] if m["role"] in ("system", "developer")])


@pytest.mark.parametrize("trust", [True, False], ids=["trusted", "trust-off"])
async def test_the_folders_resources_load_by_default_and_not_with_trust_off(
    tmp_path: Path, trust: bool
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    make_project(work)
    async with ScriptedModelServer([Text("ok")], model_id="scripted") as model:
        pi = await run_piwork_pi(
            tmp_path, work, model, "hello", settings=PiSettings(trust_project=trust),
            then=("get_commands",),
        )  # fmt: skip
    commands = pi.replies["get_commands"]["data"]["commands"]

    assert not pi.of_type("extension_error"), pi.of_type("extension_error")
    body = model.chat_requests[0].body
    tools = {t["function"]["name"] for t in body["tools"]}
    names = {c["name"] for c in commands}
    (status,) = [
        e
        for e in pi.events
        if e.get("type") == "extension_ui_request" and e.get("statusKey") == REPORT_KEY
    ]
    report = parse_project_report(status["statusText"])
    assert report is not None, status
    assert report.trusted is trust
    if trust:
        assert MARK in system_text(body)  # AGENTS.md reached the model's system prompt
        assert {"codemode", "hello_project"} <= tools  # .pi/settings.json, .pi/extensions
        assert {"skill:tidy", "release"} <= names
        assert report.context_files == ["AGENTS.md"]
        assert report.settings == [".pi/settings.json"]
        assert report.skills == ["tidy"] and report.prompts == ["/release"]
        assert report.extensions == [".pi/extensions/hello.ts"]
    else:
        assert MARK not in system_text(body)
        assert not {"codemode", "hello_project"} & tools
        assert not {"skill:tidy", "release"} & names
        assert report.context_files == report.extensions == report.skills == []
