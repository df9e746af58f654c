"""Settings → Permissions: the person's rules, the built-in ones, the audit log, and what
the tab says when the rules file is damaged.

A ``policy.json`` that cannot be read is never taken for "no rules" (piwork.policy.store):
no task runs on it and nothing is written over it. The tab says so in a banner that names
the file, where the damaged bytes were kept and how to put the last good copy back (the
button does what ``piwork policy restore`` does), and the rules cannot be edited until
then: an edit would be refused by the store anyway, and must not look possible.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QPlainTextEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from piwork.config import Paths
from piwork.gui.asking import ask
from piwork.gui.text import sanitize, shown_rule
from piwork.gui.widgets import plain_label, plain_labels, plain_tip
from piwork.gui.words import VERDICT_WORDS, audit_line, task_titles
from piwork.jsonstore import NothingToRestore
from piwork.policy import (
    DEFAULT_RULES,
    Action,
    AuditLog,
    PolicyStore,
    Rule,
    Scope,
    ScopeKind,
    Verdict,
)
from piwork.policy.store import RESTORE_COMMAND, PolicyDamaged, PolicyError

HEADLINE = "Your permission rules cannot be read, so no task starts until they are restored."


def damage_words(damage: PolicyDamaged) -> str:
    """The banner's text: what is wrong, what it means, where the bytes are, what to do."""
    parts = [
        f"{damage.path} is damaged ({damage.detail}); the rules cannot be edited here until "
        "it is restored."
    ]
    if damage.kept is not None:
        parts.append(f"A copy of the damaged file is kept at {damage.kept}.")
    if damage.last_good is not None:
        parts.append(
            f"“Restore the last good copy” puts back {damage.last_good} "
            f"(the same as `{RESTORE_COMMAND}` in a terminal)."
        )
    else:
        parts.append(
            "There is no earlier good copy: fix the file by hand, or start over with no rules "
            "of your own (`piwork policy reset --yes` in a terminal)."
        )
    return sanitize(" ".join(parts), limit=2000)


class PolicyTab(QWidget):
    def __init__(self, paths: Paths) -> None:
        super().__init__()
        self.paths = paths
        self.damage: PolicyDamaged | None = None
        self.add_rule_dialog: AddRuleDialog | None = None
        self.reset_box: QWidget | None = None
        lay = QVBoxLayout(self)
        self.banner = QFrame()
        self.banner.setObjectName("policyDamaged")
        self.banner.setStyleSheet(
            "#policyDamaged { background: #fdecea; border: 1px solid #e0a8a0; border-radius: 4px; }"
        )
        brow = QHBoxLayout(self.banner)
        words = QVBoxLayout()
        self.banner_title = plain_label(HEADLINE)
        self.banner_title.setStyleSheet("font-weight: bold;")
        self.banner_title.setWordWrap(True)
        self.banner_text = plain_label()
        self.banner_text.setWordWrap(True)
        self.banner_text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        words.addWidget(self.banner_title)
        words.addWidget(self.banner_text)
        brow.addLayout(words, 1)
        self.restore_btn = QPushButton("Restore the last good copy")
        self.restore_btn.clicked.connect(self.restore)
        brow.addWidget(self.restore_btn)
        self.banner.hide()
        lay.addWidget(self.banner)
        lay.addWidget(plain_label("Your rules (saved with “Always allow”, or added here):"))
        self.rules = QTableWidget(0, 5)
        self.rules.setObjectName("rulesTable")
        self.rules.setHorizontalHeaderLabels(["Rule", "Answer", "Where", "Matching", "Made"])
        self.rules.horizontalHeader().setStretchLastSection(True)
        lay.addWidget(self.rules, 2)
        row = QHBoxLayout()
        self.add_btn = QPushButton("Add rule…")
        self.add_btn.clicked.connect(self.add_rule)
        self.delete_btn = QPushButton("Delete selected rule")
        self.delete_btn.clicked.connect(self._delete_rule)
        self.reset_btn = QPushButton("Remove all my rules…")
        self.reset_btn.clicked.connect(self._reset_rules)
        for b in (self.add_btn, self.delete_btn, self.reset_btn):
            row.addWidget(b)
        row.addStretch(1)
        lay.addLayout(row)
        lay.addWidget(plain_label("Built in (your rules come first):"))
        self.builtin = QListWidget()
        self.builtin.setObjectName("builtinRules")
        for r in DEFAULT_RULES:
            self.builtin.addItem(f"{r.human()} — {r.note}" if r.note else r.human())
        self.builtin.setMaximumHeight(150)
        lay.addWidget(self.builtin, 1)
        lay.addWidget(plain_label("Audit log (newest first):"))
        self.audit = QPlainTextEdit()
        self.audit.setReadOnly(True)
        lay.addWidget(self.audit, 1)
        self.refresh_policy()

    @property
    def editable(self) -> bool:
        return self.damage is None

    def refresh_policy(self) -> None:
        problem: str | None = None
        self.damage = None
        try:
            rules = PolicyStore(self.paths.policy_file).load()
        except PolicyDamaged as exc:
            rules, self.damage, problem = [], exc, damage_words(exc)
        except (PolicyError, OSError) as exc:
            rules = []
            problem = sanitize(str(exc), limit=2000)
        self.banner.setVisible(problem is not None)
        self.banner_title.setText(HEADLINE)
        self.banner_text.setText(problem or "")
        self.restore_btn.setVisible(self.damage is not None and self.damage.last_good is not None)
        for w in (self.rules, self.add_btn, self.delete_btn, self.reset_btn):
            w.setEnabled(problem is None)
        self._rules = rules
        self.rules.setRowCount(len(rules))
        for i, r in enumerate(rules):
            # In the person's words and paths: their folder's files relative to it, the
            # scope as a folder or "every folder", the day it was made. The exact rule
            # (as `piwork policy list` prints it) is the row's tooltip.
            shown = shown_rule(r)
            where = "every folder" if r.scope.kind is ScopeKind.GLOBAL else str(r.scope.value)
            cells = [shown.human(), VERDICT_WORDS.get(r.verdict.value, r.verdict.value), where,
                     shown.pattern or "anything", str(r.created)[:10]]  # fmt: skip
            for j, v in enumerate(cells):
                cell = QTableWidgetItem(sanitize(v, limit=400, keep_newlines=False))
                cell.setToolTip(plain_tip(sanitize(r.describe(), limit=400)))
                self.rules.setItem(i, j, cell)
        self.rules.resizeColumnsToContents()
        try:
            entries = list(AuditLog(self.paths.audit_log).read())[-200:]
            titles = task_titles(self.paths)
            lines = [audit_line(e, titles) for e in reversed(entries)]
            self.audit.setPlainText(sanitize("\n".join(lines) or "(empty)", limit=200_000))
        except Exception as exc:  # the audit log is for reading: say why it cannot be
            self.audit.setPlainText(sanitize(f"cannot read the audit log: {exc}", limit=2000))

    def restore(self) -> None:
        """What ``piwork policy restore`` does: the last good copy back, the damaged kept."""
        try:
            PolicyStore(self.paths.policy_file).restore()
        except (NothingToRestore, PolicyError, OSError) as exc:
            self.refresh_policy()
            self.banner.show()
            self.banner_text.setText(sanitize(f"Not restored: {exc}", limit=2000))
            return
        self.refresh_policy()

    def rule_texts(self) -> list[str]:
        items = [self.rules.item(i, 0) for i in range(self.rules.rowCount())]
        return [it.text() for it in items if it is not None]

    def _change(self, change: Callable[[], object]) -> None:
        """Run a store edit; a file damaged since the tab was drawn shows the banner (the
        store refuses to write over it) instead of raising out of a Qt slot."""
        try:
            change()
        except (PolicyError, OSError) as exc:
            self.refresh_policy()
            if self.damage is None:  # not damage (a full disk, a lock): say it all the same
                self.banner.show()
                self.banner_title.setText("Your change to the rules was not saved.")
                self.banner_text.setText(sanitize(str(exc), limit=2000))
            return
        self.refresh_policy()

    def add_rule(self) -> None:
        """A rule by hand: what, allow/ask/deny, everywhere or in one folder, a pattern."""
        if not self.editable:
            return
        dlg = AddRuleDialog(self)
        self.add_rule_dialog = dlg

        def done(result: int) -> None:
            rule = dlg.rule() if result == QDialog.DialogCode.Accepted else None
            if rule is not None:
                self._change(lambda: PolicyStore(self.paths.policy_file).add(rule))

        dlg.finished.connect(done)
        dlg.open()

    def _delete_rule(self) -> None:
        row = self.rules.currentRow()
        if self.editable and 0 <= row < len(self._rules):
            rule_id = self._rules[row].id
            self._change(lambda: PolicyStore(self.paths.policy_file).remove(rule_id))

    def _reset_rules(self) -> None:
        if not self.editable:
            return
        self.reset_box = ask(
            self,
            "Remove your rules?",
            "Remove every rule you saved? The built-in rules stay.",
            "Remove my rules",
            lambda: self._change(lambda: PolicyStore(self.paths.policy_file).reset()),
        )


class AddRuleDialog(QDialog):
    """What a person can say without knowing the rule syntax; the rule line it makes is
    shown before it is stored."""

    ACTIONS = (
        (Action.SHELL, "run a command"),
        (Action.WRITE, "change files"),
        (Action.DELETE, "delete files"),
        (Action.MOVE, "move or rename files"),
        (Action.NETWORK, "reach a web address"),
        (Action.PRIVATE_NETWORK, "reach a private address (a company network, this computer)"),
        (Action.OUTSIDE_SCOPE, "touch files outside the task's folders"),
        (Action.READ, "read files"),
    )

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Add a rule")
        self.setMinimumWidth(560)
        form = QFormLayout(self)
        form.setSizeConstraint(QFormLayout.SizeConstraint.SetMinimumSize)
        self.verdict = QComboBox()
        # "Ask" first: the dialog never opens on "allow anything everywhere" (issue 33).
        for v, label in ((Verdict.ASK, "Ask"), (Verdict.ALLOW, "Allow"), (Verdict.DENY, "Deny")):
            self.verdict.addItem(label, v)
        form.addRow("", self.verdict)
        self.action = QComboBox()
        for a, label in self.ACTIONS:
            self.action.addItem(label, a)
        form.addRow("when the agent wants to", self.action)
        self.pattern = QLineEdit()
        self.pattern.setPlaceholderText("e.g. make test · src/** · pypi.org (empty: anything)")
        form.addRow("matching", self.pattern)
        self.folder = QLineEdit()
        self.folder.setPlaceholderText("empty: in every folder")
        form.addRow("in tasks on folder", self.folder)
        self.preview = plain_label()
        self.preview.setObjectName("rulePreview")
        self.preview.setWordWrap(True)
        form.addRow("Rule", self.preview)
        self.warning = plain_label()
        self.warning.setObjectName("ruleWarning")
        self.warning.setWordWrap(True)
        form.addRow("", self.warning)
        buttons = QDialogButtonBox()
        self.add_btn = buttons.addButton("Add the rule", QDialogButtonBox.ButtonRole.AcceptRole)
        cancel = buttons.addButton(QDialogButtonBox.StandardButton.Cancel)
        # Enter never stores a rule: Cancel is the default.
        self.add_btn.setAutoDefault(False)
        cancel.setDefault(True)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)
        for w in (self.verdict, self.action):
            w.currentIndexChanged.connect(self._show)
        for e in (self.pattern, self.folder):
            e.textChanged.connect(self._show)
        self._show()
        plain_labels(self)

    def rule(self) -> Rule | None:
        folder = self.folder.text().strip()
        pattern = self.pattern.text().strip() or None
        return Rule(
            action=Action(self.action.currentData()),
            verdict=Verdict(self.verdict.currentData()),
            scope=Scope.folder(folder) if folder else Scope.global_(),
            pattern=pattern,
        )

    def _show(self) -> None:
        r = self.rule()
        self.preview.setText(sanitize(r.human(), limit=400) if r is not None else "")
        wide = (
            r is not None
            and r.verdict is Verdict.ALLOW
            and r.pattern is None
            and r.scope.kind is ScopeKind.GLOBAL
        )
        self.warning.setText(
            "This allows it for ANY target, in EVERY task and folder: add a pattern or a "
            "folder to narrow it."
            if wide
            else ""
        )
        self.warning.setVisible(wide)
        self.adjustSize()  # the words never end cut off
