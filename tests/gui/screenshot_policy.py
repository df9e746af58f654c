"""Render Settings → Permissions with a damaged policy file, under a real X server.

    xvfb-run -a -s "-screen 0 1440x900x24" \\
        .venv/bin/python tests/gui/screenshot_policy.py docs/screenshots

No VM: the damage is the file's own. A rule is saved (the last good copy is kept beside
the file), then the file is cut short as a bad sync or another tool leaves it; the real
Settings dialog opens on Permissions (``settings-policy-damaged.png``). Look at the PNG
before committing it.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: the kit beside it
import shotkit


async def shoot(app: Any, home: Path, out: Path) -> None:
    from piwork.config import get_paths
    from piwork.gui.prefs import Prefs
    from piwork.gui.settings import SettingsDialog
    from piwork.policy import Action, PolicyStore, Rule, Scope, Verdict

    paths = get_paths()
    store = PolicyStore(paths.policy_file)
    store.add(Rule(Action.SHELL, Verdict.ALLOW, Scope.global_(), pattern="make test"))
    paths.policy_file.write_bytes(paths.policy_file.read_bytes()[:40])  # torn
    dlg = SettingsDialog(paths, Prefs())
    dlg.resize(980, 600)
    dlg.show()
    dlg.tabs.setCurrentWidget(dlg.policy_tab)
    await functools.partial(shotkit.snap, settle=1.5, out=out)(dlg, "settings-policy-damaged")
    dlg.close()


if __name__ == "__main__":
    shotkit.run_shots(shoot)
