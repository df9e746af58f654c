"""The conversation's pieces: messages (Markdown, highlighted code), tool rows, sheets."""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.token import Comment, Keyword, Name, Number, Operator, String, Token
from pygments.util import ClassNotFound
from PySide6.QtCore import QSize, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import (
    QColor,
    QDesktopServices,
    QFont,
    QImage,
    QKeyEvent,
    QResizeEvent,
    QSyntaxHighlighter,
    QTextCharFormat,
    QTextDocument,
    QTextFormat,
)
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from piwork.gui.text import button_text, rule_syntax, rule_words, sanitize
from piwork.policy import Choice, Rule
from piwork.preview import PreviewChoice, PreviewQuestion

_COLOURS: list[tuple[object, str]] = [
    (Comment, "#6a737d"),
    (Keyword, "#d73a49"),
    (String, "#032f62"),
    (Number, "#005cc5"),
    (Name.Function, "#6f42c1"),
    (Name.Builtin, "#005cc5"),
    (Operator, "#d73a49"),
]


class CodeHighlighter(QSyntaxHighlighter):
    """Colours fenced code blocks of a Markdown document with pygments, line by line."""

    def highlightBlock(self, text: str) -> None:
        fmt = self.currentBlock().blockFormat()
        if not fmt.hasProperty(QTextFormat.Property.BlockCodeFence) and not fmt.hasProperty(
            QTextFormat.Property.BlockCodeLanguage
        ):
            return
        lang = str(fmt.property(QTextFormat.Property.BlockCodeLanguage) or "")
        try:
            lexer = get_lexer_by_name(lang) if lang else TextLexer()
        except ClassNotFound:
            lexer = TextLexer()
        pos = 0
        for ttype, value in lexer.get_tokens(text):
            colour = None
            for base, c in _COLOURS:
                if ttype in base:  # type: ignore[operator]
                    colour = c
                    break
            if colour and ttype is not Token.Text:
                f = QTextCharFormat()
                f.setForeground(QColor(colour))
                self.setFormat(pos, len(value), f)
            pos += len(value)


def plain_labels(root: QWidget) -> None:
    """Every label under ``root`` that would guess (a form row's, made by the layout)
    shows its text as text: no label of the app guesses rich text."""
    for label in root.findChildren(QLabel):
        if label.textFormat() is Qt.TextFormat.AutoText:
            label.setTextFormat(Qt.TextFormat.PlainText)


def plain_tip(text: str) -> str:
    """Guest text as a tooltip: tooltips guess rich text like labels do, so the text is
    escaped inside a rich-text paragraph (shown as typed, never parsed for tags)."""
    return f"<p style='white-space:pre-wrap'>{html.escape(text)}</p>" if text else ""


def plain_label(text: str = "") -> QLabel:
    """A label that shows its text as text. QLabel guesses "rich text" from a leading
    tag, and rich text loads ``<img src>`` from disk: guest text must never be guessed."""
    label = QLabel()
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setText(text)
    return label


# Guest Markdown is rendered inert (SECURITY-REVIEW.md finding 9): an image or style
# sheet reference must never be read (`![](/dev/zero)` exhausts memory, a FIFO blocks the
# window, a host path shows the person's own files), and a link's text is guest-chosen,
# so only its real target counts.
_BLANK = QImage(1, 1, QImage.Format.Format_ARGB32)
_BLANK.fill(0)
WEB_SCHEMES = ("http", "https")


class InertDocument(QTextDocument):
    """A document that never loads a resource: every image is a blank pixel, every other
    resource empty. Overridden here, on the document, because QTextDocument itself reads
    ``file:`` and path URLs when its browser declines."""

    def loadResource(self, type: int, name: QUrl | str) -> Any:
        return _BLANK if type == QTextDocument.ResourceType.ImageResource.value else b""


def strip_images(doc: QTextDocument) -> int:
    """Replace every image in ``doc`` by its alt text in brackets (nothing is fetched, and
    the person still sees that the agent meant an image). Returns how many."""
    from PySide6.QtGui import QTextCursor

    found: list[tuple[int, int, str]] = []
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.isValid() and frag.charFormat().isImageFormat():
                img = frag.charFormat().toImageFormat()
                alt = str(img.property(QTextFormat.Property.ImageAltText) or "") or "image"
                found.append((frag.position(), frag.length(), alt))
            it += 1
        block = block.next()
    for pos, length, alt in reversed(found):
        cur = QTextCursor(doc)
        cur.setPosition(pos)
        cur.setPosition(pos + length, QTextCursor.MoveMode.KeepAnchor)
        cur.insertText(f"[{sanitize(alt, limit=80, keep_newlines=False)}]", QTextCharFormat())
    return len(found)


def set_inert_markdown(doc: QTextDocument, text: str) -> None:
    """Guest Markdown: no raw HTML, images replaced by their alt text."""
    features = (
        QTextDocument.MarkdownFeature.MarkdownDialectGitHub.value
        | QTextDocument.MarkdownFeature.MarkdownNoHTML.value
    )
    doc.setMarkdown(text, QTextDocument.MarkdownFeature(features))
    strip_images(doc)


def ask_to_open(url: QUrl, parent: QWidget | None) -> QMessageBox | None:
    """A link clicked in guest text: only web links open, and only after the person saw
    where it really goes (the text of a link is the guest's; ``smb:`` or ``vscode:``
    behind "https://…" would run a handler on the host)."""
    shown = sanitize(url.toString(), limit=500, keep_newlines=False)
    box = QMessageBox(parent)
    box.setTextFormat(Qt.TextFormat.PlainText)  # guest paths and links: never rich text
    if url.scheme().lower() not in WEB_SCHEMES or not url.host():
        box.setIcon(QMessageBox.Icon.Warning)
        box.setWindowTitle("Link not opened")
        box.setText("piwork opens only web links (http and https). This link goes to:")
        box.setInformativeText(shown)
        box.addButton("OK", QMessageBox.ButtonRole.AcceptRole)
        box.open()
        return box
    box.setWindowTitle("Open this link?")
    box.setText("The agent's link goes to:")
    box.setInformativeText(shown)
    go = box.addButton("Open in browser", QMessageBox.ButtonRole.AcceptRole)
    box.addButton("Cancel", QMessageBox.ButtonRole.RejectRole)

    def answered(_r: int) -> None:
        if box.clickedButton() is go:
            QDesktopServices.openUrl(url)

    box.finished.connect(answered)
    box.open()
    return box


class InertBrowser(QTextBrowser):
    """A read-only view of guest rich text: loads nothing, opens links only via
    :func:`ask_to_open`, shows a link's real target on hover."""

    def __init__(self) -> None:
        super().__init__()
        self.setDocument(InertDocument(self))
        self.setOpenExternalLinks(False)
        self.setOpenLinks(False)
        self.link_box: QMessageBox | None = None
        self.anchorClicked.connect(self._clicked)
        self.highlighted.connect(
            lambda url: self.setToolTip(
                plain_tip(sanitize(url.toString(), limit=500, keep_newlines=False))
            )
        )

    def loadResource(self, type: int, name: QUrl | str) -> Any:
        return _BLANK if type == QTextDocument.ResourceType.ImageResource.value else b""

    def _clicked(self, url: QUrl) -> None:
        self.link_box = ask_to_open(url, self)


class AutoHeightBrowser(InertBrowser):
    """A read-only rich text view as tall as its content (the conversation scrolls, not it)."""

    def __init__(self) -> None:
        super().__init__()
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)

    def _fit(self) -> None:
        h = int(self.document().size().height()) + 8
        if h != self.height():
            self.setFixedHeight(h)

    def resizeEvent(self, e: object) -> None:
        super().resizeEvent(e)  # type: ignore[arg-type]
        self.document().setTextWidth(self.viewport().width())
        self._fit()


class MessageView(QFrame):
    """One message. The agent's streams in: re-rendered as Markdown at most every
    ``interval`` ms (longer when rendering is slow), so a 50 KB answer is not re-parsed
    per token."""

    def __init__(self, who: str, text: str = "", *, markdown: bool = True) -> None:
        super().__init__()
        self.who = who
        self.setObjectName("msg-" + who)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 6, 10, 6)
        lay.setSpacing(2)
        head = plain_label({"you": "You", "agent": "Agent"}.get(who, who))
        head.setObjectName("msgHead")
        lay.addWidget(head)
        self.body = AutoHeightBrowser()
        self.body.setObjectName("msgBody")
        self.highlighter = CodeHighlighter(self.body.document())
        lay.addWidget(self.body)
        self.text = ""
        self.markdown = markdown
        self.renders = 0
        self._pending = False
        self._interval = 80
        if text:
            self.append(text)
            self.flush()

    def append(self, delta: str) -> None:
        self.text += delta
        if not self._pending:
            self._pending = True
            QTimer.singleShot(self._interval, self.flush)

    def flush(self) -> None:
        self._pending = False
        t = time.monotonic()
        shown = sanitize(self.text, limit=500_000)
        if self.markdown:
            set_inert_markdown(self.body.document(), shown)
        else:
            self.body.setPlainText(shown)
        self.renders += 1
        cost_ms = (time.monotonic() - t) * 1000
        self._interval = int(min(1000, max(80, cost_ms * 4)))


def sheet_head(sheet: QFrame, title: str, queued: int, what: str) -> tuple[QVBoxLayout, QLabel]:
    """A question sheet's frame, its title (with how many more wait) and its main text:
    what the permission sheet and the preview sheet share."""
    sheet.setObjectName("permissionSheet")
    sheet.setFrameShape(QFrame.Shape.StyledPanel)
    lay = QVBoxLayout(sheet)
    head = plain_label(title + (f"  ({queued} more waiting)" if queued else ""))
    head.setObjectName("sheetTitle")
    lay.addWidget(head)
    label = plain_label(what)
    label.setWordWrap(True)
    label.setObjectName("sheetWhat")
    lay.addWidget(label)
    return lay, label


class ToolRow(QFrame):
    """One tool step: icon, tool, key argument, ok/error, duration; click to see the output."""

    # Symbols DejaVu Sans has (emoji fonts are often missing on Linux desktops).
    ICONS: ClassVar[dict[str, str]] = {
        "bash": "$",
        "read": "≡",
        "write": "✎",
        "edit": "✎",
        "ls": "▦",
        "grep": "⌕",
        "ask_user": "?",
    }

    def __init__(self, call_id: str, name: str, arg: str) -> None:
        super().__init__()
        self.setObjectName("toolRow")
        self.call_id = call_id
        self.name = sanitize(name, limit=60, keep_newlines=False)
        self.arg = sanitize(arg, limit=160, keep_newlines=False)
        self.t0 = time.monotonic()
        self.ok: bool | None = None
        self.ended = ""  # ok, failed, denied, interrupted
        self.duration: float | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 2, 8, 2)
        lay.setSpacing(0)
        self.head = QPushButton()
        self.head.setObjectName("toolHead")
        self.head.setFlat(True)
        self.head.setCheckable(True)
        self.head.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.head.toggled.connect(self._toggle)
        lay.addWidget(self.head)
        self.output = QPlainTextEdit()
        self.output.setReadOnly(True)
        self.output.setObjectName("toolOutput")
        self.output.setMaximumHeight(220)
        self.output.setFont(QFont("DejaVu Sans Mono", 9))
        self.output.hide()
        lay.addWidget(self.output)
        self._render()

    def _render(self) -> None:
        icon = self.ICONS.get(self.name, "•")
        if self.ok is None:
            state = "…"
        elif self.ended == "interrupted":
            state = "■ interrupted"  # cut off (a stop, a crash): it never ended
        else:
            # How the step ended in the person's words: a denial is no error (issue 33).
            state = {"ok": "✓", "denied": "⊘ denied"}.get(self.ended, "✗ failed")
            if self.duration is not None:
                state += f"  {self.duration:.1f}s"
        arrow = "▾" if self.head.isChecked() else "▸"
        line = button_text(f"{self.name}  {self.arg}", limit=240)
        self.head.setText(f"{arrow} {icon} {line}   {state}")
        look = {"ok": "ok", "denied": "denied", "interrupted": "denied"}.get(self.ended, "err")
        self.head.setProperty("state", "run" if self.ok is None else look)
        self.head.style().unpolish(self.head)
        self.head.style().polish(self.head)

    def finish(
        self, ok: bool, text: str, *, seconds: float | None = None, denied: bool = False
    ) -> None:
        """The step ended: ``seconds`` is its duration when replayed from the transcript
        (live, the row's own clock); ``denied``: it failed because a permission was
        denied (shown as such, not as an error)."""
        self.ok = ok
        self.ended = "ok" if ok else ("denied" if denied else "failed")
        self.duration = seconds if seconds is not None else time.monotonic() - self.t0
        self.output.setPlainText(sanitize(text or "(no output)", limit=20_000))
        self._render()

    def interrupt(self) -> None:
        """It never ended (the run was stopped or the app died): no more "…"."""
        if self.ok is None:
            self.ok = False
            self.ended = "interrupted"
            self.duration = None
            self._render()

    def _toggle(self, on: bool) -> None:
        self.output.setVisible(on)
        self._render()


class NoticeRow(QLabel):
    def __init__(self, text: str, kind: str = "notice") -> None:
        super().__init__()
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setText(sanitize(text, limit=2000))
        self.setObjectName("notice-" + kind)
        self.setWordWrap(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)


class FitScroll(QScrollArea):
    """A scroll area as tall as its word-wrapped contents at its width, up to its maximum
    height (then it scrolls). A plain one asked for the label's guess at a narrow width,
    and a two-line rule sat in the middle of a box of empty space."""

    def __init__(self) -> None:
        super().__init__()
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)

    def sizeHint(self) -> QSize:
        inner = self.widget()
        base = super().sizeHint()
        if inner is None:
            return base
        width = max(self.viewport().width(), 200)
        tall = inner.heightForWidth(width) if inner.hasHeightForWidth() else -1
        tall = tall if tall > 0 else inner.sizeHint().height()
        return QSize(base.width(), min(self.maximumHeight(), tall + 2 * self.frameWidth()))

    def minimumSizeHint(self) -> QSize:
        # QAbstractScrollArea's minimum makes room for a vertical scroll bar (~70 px):
        # short contents need none, long ones scroll inside the maximum height.
        return QSize(super().minimumSizeHint().width(), self.sizeHint().height())

    def resizeEvent(self, e: QResizeEvent) -> None:
        super().resizeEvent(e)
        self.updateGeometry()  # a new width wraps the lines anew


class PermissionSheet(QFrame):
    """One permission request: plain words, the rule "Always" would save, four answers, and
    "Allow the package registries" with the rules it saves when the host offered it.

    Enter answers "Deny" (the default button); it is never a button that saves rules.
    """

    answered = Signal(object)  # Choice

    def __init__(
        self,
        plain: str,
        detail: str,
        folder: str | None,
        folder_rules: Sequence[Rule],
        everywhere_rules: Sequence[Rule],
        queued: int = 0,
        registry_rules: Sequence[Rule] = (),
    ) -> None:
        super().__init__()
        lay, self.what = sheet_head(self, "Permission needed", queued, plain)
        self.detail: QLabel | None = None
        if detail:
            # The guest's own wording (pi's gate, in the VM) mostly says again what the
            # host's words above say: folded away, one click to compare (issue 33).
            d = plain_label("In the agent's words: " + detail)
            d.setWordWrap(True)
            d.setObjectName("sheetDetail")
            d.hide()
            more = QPushButton("The agent's own words…")
            more.setFlat(True)
            more.setObjectName("sheetMore")
            more.clicked.connect(lambda: d.setVisible(not d.isVisible()))
            lay.addWidget(more, 0, Qt.AlignmentFlag.AlignLeft)  # under the words it folds
            lay.addWidget(d)
            self.detail = d
        lay.addWidget(plain_label(f"Working folder: {folder or '(none)'}"))
        # The exact rules "Always" stores, paths in the person's folder relative to it.
        self.rule_label = plain_label(self._rule_text(folder_rules, everywhere_rules))
        self.rule_label.setToolTip(
            plain_tip(
                f"“Always allow in this folder”: {rule_syntax(folder_rules)}\n"
                f"“Always allow everywhere”: {rule_syntax(everywhere_rules)}"
            )
        )
        self.rule_label.setObjectName("sheetRule")
        self.rule_label.setWordWrap(True)
        self.rule_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # A request with several targets makes these rules long: they scroll rather than
        # push the buttons off the sheet or get cut off at its edge.
        rules_box = FitScroll()
        rules_box.setObjectName("sheetRuleBox")
        rules_box.setWidget(self.rule_label)
        rules_box.setWidgetResizable(True)
        rules_box.setFrameShape(QFrame.Shape.NoFrame)
        rules_box.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        rules_box.setMaximumHeight(130)
        self.rule_label.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        lay.addWidget(rules_box)
        self.registry_label: QLabel | None = None
        choices = [
            (Choice.ALLOW_ONCE, "Allow once"),
            (Choice.ALWAYS_FOLDER, "Always allow in this folder"),
            (Choice.ALWAYS_EVERYWHERE, "Always allow everywhere"),
        ]
        if registry_rules:
            # One answer for apt, pip and npm: every rule it saves, before it is picked.
            self.registry_label = plain_label(
                f"“Allow the package registries” (apt, pip, npm) saves {len(registry_rules)} "
                "rules:\n"
                + "\n".join(f"    {sanitize(r.human(), limit=300)}" for r in registry_rules)
            )
            self.registry_label.setObjectName("sheetRegistries")
            self.registry_label.setWordWrap(True)
            self.registry_label.setTextInteractionFlags(
                Qt.TextInteractionFlag.TextSelectableByMouse
            )
            lay.addWidget(self.registry_label)
            choices.append((Choice.ALLOW_REGISTRIES, "Allow the package registries"))
        choices.append((Choice.DENY, "Deny"))
        row = QHBoxLayout()
        self.buttons: dict[Choice, QPushButton] = {}
        for choice, label in choices:
            b = QPushButton(label)
            b.setAutoDefault(choice is Choice.DENY)
            b.setDefault(choice is Choice.DENY)
            b.clicked.connect(lambda _=False, c=choice: self.answered.emit(c))
            if choice.persists and not (
                folder_rules if choice is Choice.ALWAYS_FOLDER else everywhere_rules
            ):
                b.setEnabled(False)
                b.setToolTip("this request cannot be remembered as a rule")
            self.buttons[choice] = b
            row.addWidget(b)
        lay.addLayout(row)

    @staticmethod
    def _rule_text(folder_rules: Sequence[Rule], everywhere_rules: Sequence[Rule]) -> str:
        return (
            f"“Always allow in this folder” saves: {rule_words(folder_rules)}\n"
            f"“Always allow everywhere” saves: {rule_words(everywhere_rules)}"
        )

    def keyPressEvent(self, e: QKeyEvent) -> None:
        if e.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            focused = self.focusWidget()
            # Enter on a focused "Allow once" button answers it; anywhere else it denies.
            for choice, b in self.buttons.items():
                if b is focused and choice is Choice.ALLOW_ONCE:
                    self.answered.emit(choice)
                    return
            self.answered.emit(Choice.DENY)
            return
        super().keyPressEvent(e)


class PreviewSheet(QFrame):
    """The preview question: the permission sheet's look, three answers, and under each
    answer the rule it stores, in plain words. Enter answers "Never" (the default)."""

    answered = Signal(object)  # PreviewChoice

    def __init__(self, q: PreviewQuestion, queued: int = 0) -> None:
        super().__init__()
        question = sanitize(q.question, limit=600)
        lay, self.what = sheet_head(self, "Open a preview?", queued, question)
        row = QHBoxLayout()
        self.buttons: dict[PreviewChoice, QPushButton] = {}
        self.rule_labels: dict[PreviewChoice, QLabel] = {}
        for choice in PreviewChoice:
            col = QVBoxLayout()
            b = QPushButton(choice.value)
            b.setAutoDefault(choice is PreviewChoice.NEVER)
            b.setDefault(choice is PreviewChoice.NEVER)
            b.clicked.connect(lambda _=False, c=choice: self.answered.emit(c))
            self.buttons[choice] = b
            col.addWidget(b)
            rule = q.rules.get(choice)
            hint = plain_label(rule.human() if rule is not None else "")
            hint.setObjectName("sheetRule")
            hint.setWordWrap(True)
            self.rule_labels[choice] = hint
            col.addWidget(hint)
            col.addStretch(1)
            row.addLayout(col, 1)
        lay.addLayout(row)

    def keyPressEvent(self, e: QKeyEvent) -> None:
        if e.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            self.answered.emit(PreviewChoice.NEVER)
            return
        super().keyPressEvent(e)


def open_preview(url: str) -> None:
    """Open a preview in the person's browser (the URL is piwork's own loopback address)."""
    QDesktopServices.openUrl(QUrl(url))


class PreviewRow(QFrame):
    """A preview in the conversation: "Preview of port N" and a button that opens it;
    greyed once the preview closes, the reason shown when it was refused."""

    def __init__(self, port: int, url: str | None) -> None:
        super().__init__()
        self.setObjectName("previewRow")
        self.port = port
        self.url = url
        lay = QHBoxLayout(self)
        lay.setContentsMargins(8, 2, 8, 2)
        self.label = plain_label(f"Preview of port {port}")
        lay.addWidget(self.label, 1)
        self.open_btn = QPushButton("Open preview")
        self.open_btn.clicked.connect(self._open)
        lay.addWidget(self.open_btn)
        self.set_open(url)

    def set_open(self, url: str | None) -> None:
        self.url = url
        self.open_btn.setEnabled(url is not None)
        self.open_btn.setToolTip(url or "")
        self.label.setText(f"Preview of port {self.port}" + ("" if url else " (not open)"))

    def set_closed(self, reason: str | None = None) -> None:
        self.url = None
        self.open_btn.setEnabled(False)
        why = f": {sanitize(reason, limit=200, keep_newlines=False)}" if reason else ""
        self.label.setText(f"Preview of port {self.port} (closed{why})")

    def set_refused(self, reason: str) -> None:
        self.url = None
        self.open_btn.setEnabled(False)
        why = sanitize(reason, limit=200, keep_newlines=False)
        self.label.setText(f"Preview of port {self.port} refused: {why}")

    def _open(self) -> None:
        if self.url is not None:
            open_preview(self.url)


class QuestionBar(QFrame):
    """The agent's ``ask_user`` question in the composer: buttons for a select, else a field."""

    answered = Signal(object)

    def __init__(
        self, method: str, title: str, message: str | None, options: list[str] | None
    ) -> None:
        super().__init__()
        self.setObjectName("questionBar")
        lay = QVBoxLayout(self)
        q = plain_label("The agent asks: " + sanitize(title, limit=1000))
        q.setWordWrap(True)
        q.setObjectName("questionText")
        lay.addWidget(q)
        if message:
            m = plain_label(sanitize(message, limit=2000))
            m.setWordWrap(True)
            lay.addWidget(m)
        row = QHBoxLayout()
        self.option_buttons: list[QPushButton] = []
        if method == "select" and options:
            for opt in options[:20]:
                b = QPushButton(button_text(opt, limit=120))
                b.clicked.connect(lambda _=False, o=opt: self.answered.emit(o))
                self.option_buttons.append(b)
                row.addWidget(b)
        elif method == "confirm":
            for label, val in (("Yes", True), ("No", False)):
                b = QPushButton(label)
                b.clicked.connect(lambda _=False, v=val: self.answered.emit(v))
                self.option_buttons.append(b)
                row.addWidget(b)
        else:
            self.field = QLineEdit()
            self.field.returnPressed.connect(lambda: self.answered.emit(self.field.text()))
            row.addWidget(self.field)
            ok = QPushButton("Answer")
            ok.clicked.connect(lambda: self.answered.emit(self.field.text()))
            row.addWidget(ok)
        skip = QPushButton("Skip")
        skip.clicked.connect(lambda: self.answered.emit(None))
        row.addWidget(skip)
        lay.addLayout(row)


class Composer(QPlainTextEdit):
    """Enter sends (steers while running), Alt+Enter queues a follow-up, Shift+Enter: newline."""

    send = Signal(str)
    queue_follow_up = Signal(str)

    def __init__(self) -> None:
        super().__init__()
        self.setPlaceholderText(
            "Describe a task…  Enter sends (steers while running) · Alt+Enter queues "
            "a follow-up · Shift+Enter new line"
        )
        self.setMaximumHeight(110)
        self.setTabChangesFocus(True)

    def sizeHint(self) -> QSize:
        return QSize(400, 70)

    def keyPressEvent(self, e: QKeyEvent) -> None:
        if e.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            mods = e.modifiers()
            if mods & Qt.KeyboardModifier.ShiftModifier:
                super().keyPressEvent(e)
                return
            text = self.toPlainText().strip()
            if not text:
                return
            if mods & Qt.KeyboardModifier.AltModifier:
                self.queue_follow_up.emit(text)
            else:
                self.send.emit(text)
            return
        super().keyPressEvent(e)


def file_kind(path: str) -> str:
    ext = Path(path).suffix.lower()
    if ext in (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".svg"):
        return "image"
    if ext in (".md", ".markdown"):
        return "markdown"
    if ext in (".csv", ".tsv"):
        return "csv"
    if ext in (".html", ".htm"):
        return "html"
    return "text"


def debounce(ms: int, fn: Callable[[], None]) -> Callable[[], None]:
    timer = QTimer()
    timer.setSingleShot(True)
    timer.setInterval(ms)
    timer.timeout.connect(fn)

    def kick() -> None:
        timer.start()

    kick.timer = timer  # type: ignore[attr-defined]
    return kick


def spacer() -> QWidget:
    w = QWidget()
    w.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
    return w
