"""transcript.jsonl: append-only records, torn-line repair, tolerant reading, write errors."""

from __future__ import annotations

import base64
import errno
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from piwork.tasks import transcript as tr
from piwork.tasks.transcript import (
    REPAIR_KIND,
    TranscriptBusy,
    TranscriptReader,
    TranscriptWriteError,
    TranscriptWriter,
    read_records,
)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "transcript.jsonl"


def lines(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_records_are_numbered_timestamped_lines(path: Path) -> None:
    with TranscriptWriter(path) as w:
        first = w.append("pi", {"type": "agent_start"})
        w.append("supervisor", {"ev": "ready", "bootId": "b"})
        w.append("note")
    assert first["seq"] == 1
    assert path.read_bytes().endswith(b"\n")
    got = lines(path)
    assert [r["seq"] for r in got] == [1, 2, 3]
    assert [r["kind"] for r in got] == ["pi", "supervisor", "note"]
    assert got[2]["data"] is None
    assert str(got[0]["t"]).endswith("Z")


def test_reopening_continues_the_sequence(path: Path) -> None:
    with TranscriptWriter(path) as w:
        for i in range(5):
            w.append("n", i)
    with TranscriptWriter(path) as w:
        assert w.next_seq == 6
        w.append("n", 5)
    records, problems = read_records(path)
    assert problems == []
    assert [r.seq for r in records] == [1, 2, 3, 4, 5, 6]


def test_only_one_writer_at_a_time(path: Path) -> None:
    with TranscriptWriter(path), pytest.raises(TranscriptBusy, match="already open"):
        TranscriptWriter(path, lock_timeout=0.05)
    with TranscriptWriter(path, lock_timeout=0.05) as w:  # free again once closed
        assert w.next_seq == 1


def test_unserialisable_data_fails_before_using_a_seq(path: Path) -> None:
    with TranscriptWriter(path) as w:
        with pytest.raises(TypeError):
            w.append("bad", object())
        assert w.append("ok")["seq"] == 1


def test_a_torn_last_line_is_moved_to_transcript_torn(path: Path) -> None:
    with TranscriptWriter(path) as w:
        w.append("a")
        w.append("b")
    with path.open("ab") as fh:
        fh.write(b'{"seq":3,"t":"2024-01-01T00:00:00Z","kind":"c","da')
    size_before = path.stat().st_size
    with TranscriptWriter(path) as w:
        assert w.repaired is not None and w.repaired.action == "moved"
        assert w.append("d")["seq"] == 4
    records, problems = read_records(path)
    assert problems == []
    assert [(r.seq, r.kind) for r in records] == [(1, "a"), (2, "b"), (3, REPAIR_KIND), (4, "d")]
    note = records[2].data
    assert note["movedTo"] == "transcript.torn" and note["action"] == "moved"
    assert note["offset"] + note["tornBytes"] == size_before
    (torn,) = lines(path.with_suffix(".torn"))
    assert torn["text"] == '{"seq":3,"t":"2024-01-01T00:00:00Z","kind":"c","da'
    assert torn["offset"] == note["offset"]


def test_torn_bytes_that_are_not_utf8_are_kept_as_base64(path: Path) -> None:
    with TranscriptWriter(path) as w:
        w.append("a")
    with path.open("ab") as fh:
        fh.write(b'{"seq":2,"data":"\xe2\x82')  # half a multibyte character
    TranscriptWriter(path).close()
    (torn,) = lines(path.with_suffix(".torn"))
    assert base64.b64decode(str(torn["base64"])) == b'{"seq":2,"data":"\xe2\x82'


def test_a_whole_record_missing_only_its_newline_is_kept(path: Path) -> None:
    with TranscriptWriter(path) as w:
        w.append("a")
    with path.open("ab") as fh:
        fh.write(b'{"seq":2,"t":"2024-01-01T00:00:00Z","kind":"b","data":null}')
    with TranscriptWriter(path) as w:
        assert w.repaired is not None and w.repaired.action == "completed"
    records, problems = read_records(path)
    assert problems == []
    assert [(r.seq, r.kind) for r in records] == [(1, "a"), (2, "b"), (3, REPAIR_KIND)]
    assert not path.with_suffix(".torn").exists()


def test_a_file_that_is_only_a_torn_line(path: Path) -> None:
    path.write_bytes(b'{"se')
    with TranscriptWriter(path) as w:
        assert w.next_seq == 2  # the repair note took 1
    records, _ = read_records(path)
    assert [r.kind for r in records] == [REPAIR_KIND]


def test_the_reader_reports_malformed_lines_and_keeps_going(path: Path) -> None:
    good = b'{"seq":%d,"t":"x","kind":"k","data":null}\n'
    path.write_bytes(
        good % 1
        + b"garbage\n"
        + b"[1,2]\n"
        + b'{"t":"x","kind":"k"}\n'
        + good % 2
        + good % 2
        + b'{"seq":3,"t":"x","kind":"k","da'
    )
    reader = TranscriptReader(path)
    records = list(reader)
    assert [r.seq for r in records] == [1, 2, 2]
    reasons = [p.reason for p in reader.problems]
    assert reasons[0].startswith("not JSON")
    assert reasons[1:] == [
        "not a JSON object",
        "missing or invalid 'seq'",
        "seq 2 does not follow 2",
        "incomplete last line",
    ]
    assert [p.line_no for p in reader.problems] == [2, 3, 4, 6, 7]


def test_seq_continues_past_malformed_trailing_lines(path: Path) -> None:
    with TranscriptWriter(path) as w:
        w.append("a")
        w.append("b")
    with path.open("ab") as fh:
        fh.write(b"\x00\x00\x00 not json\n")
    with TranscriptWriter(path) as w:
        assert w.next_seq == 3


def test_seq_is_found_behind_a_large_tail(path: Path) -> None:
    with TranscriptWriter(path) as w:
        w.append("a")
        w.append("big", "x" * 300_000)
    with TranscriptWriter(path) as w:
        assert w.next_seq == 3


def test_a_missing_transcript_reads_empty(tmp_path: Path) -> None:
    assert read_records(tmp_path / "none.jsonl") == ([], [])


# ---------------------------------------------------------------- write errors


class FailingWrite:
    """Stands in for os.write: writes ``partial`` bytes of the next call, then fails."""

    def __init__(self, err: int, partial: int = 0) -> None:
        self.err = err
        self.partial = partial
        self.armed = True

    def __call__(self, fd: int, data: memoryview) -> int:
        if not self.armed:
            return os.write(fd, data)
        if self.partial:
            n = os.write(fd, data[: self.partial])
            self.partial = 0
            return n
        raise OSError(self.err, os.strerror(self.err))


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO])
@pytest.mark.parametrize("partial", [0, 7])
def test_a_refused_write_keeps_the_record_and_the_file_clean(
    path: Path, monkeypatch: pytest.MonkeyPatch, err: int, partial: int
) -> None:
    with TranscriptWriter(path) as w:
        w.append("before")
        fail = FailingWrite(err, partial)
        monkeypatch.setattr(tr, "_os_write", fail)
        with pytest.raises(TranscriptWriteError) as info:
            w.append("lost?", {"n": 1})
        assert info.value.errno == err
        assert info.value.record is not None and info.value.record["seq"] == 2
        assert info.value.pending == 1 and w.pending == 1
        assert os.strerror(err) in str(info.value)
        # The partial line was cut back: the file is still clean JSONL.
        assert [r["seq"] for r in lines(path)] == [1]
        with pytest.raises(TranscriptWriteError) as again:
            w.append("next")
        assert again.value.pending == 2
        fail.armed = False
        assert w.retry() == 2
        w.append("after")
    records, problems = read_records(path)
    assert problems == []
    assert [(r.seq, r.kind) for r in records] == [
        (1, "before"),
        (2, "lost?"),
        (3, "next"),
        (4, "after"),
    ]


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.fail("this test mounts a 64 KiB tmpfs to fill a real disk: run the suite as root")
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True
    )
    if res.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs: {res.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_raises_enospc_and_recovers_when_space_returns(tiny_fs: Path) -> None:
    path = tiny_fs / "transcript.jsonl"
    ballast = tiny_fs / "ballast"
    with TranscriptWriter(path) as w:
        w.append("start")
        fd = os.open(ballast, os.O_WRONLY | os.O_CREAT)  # fill the filesystem
        try:
            while True:
                os.write(fd, b"\0" * 1024)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)
        error = None
        for i in range(200):
            try:
                w.append("fill", {"i": i, "pad": "y" * 512})
            except TranscriptWriteError as exc:
                error = exc
                break
        assert error is not None and error.errno == errno.ENOSPC
        assert "Free some disk space" in str(error)
        records, problems = read_records(path)
        assert problems == []  # no torn line left behind
        written = len(records)
        ballast.unlink()
        w.retry()
        w.append("end")
    records, problems = read_records(path)
    assert problems == []
    assert [r.seq for r in records] == list(range(1, written + 3))
    assert records[-1].kind == "end"


def test_batched_fsync_syncs_within_the_delay(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[float] = []
    real = tr._os_fsync

    def spy(fd: int) -> None:
        synced.append(time.monotonic())
        real(fd)

    monkeypatch.setattr(tr, "_os_fsync", spy)
    with TranscriptWriter(path, fsync_delay=0.05) as w:
        start = time.monotonic()
        for i in range(20):
            w.append("n", i)
        assert len(synced) == 0  # nothing synced inline
        deadline = start + 2
        while not synced and time.monotonic() < deadline:
            time.sleep(0.005)
        assert synced, "the background sync never ran"
        assert len(synced) == 1  # twenty lines, one fsync
    assert [r["seq"] for r in lines(path)] == list(range(1, 21))


# --- bounded size -----------------------------------------------------------


def test_a_transcript_is_rotated_and_bounded_and_says_what_it_dropped(tmp_path: Path) -> None:
    from piwork.tasks.transcript import DROPPED_SUFFIX, segment_paths

    path = tmp_path / "transcript.jsonl"
    line = "y" * 1000
    with TranscriptWriter(path, max_bytes=64 * 1024, keep_segments=2) as w:
        for i in range(1000):  # ~1 MB through a 3 x 64 KiB budget
            w.append("n", {"i": i, "pad": line})
    files = [*segment_paths(path), path]
    assert len(files) == 3
    assert sum(f.stat().st_size for f in files) < 4 * 64 * 1024
    records, problems = read_records(path)
    assert problems == []
    seqs = [r.seq for r in records]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a gap inside what is kept"
    dropped = [orjson.loads(x) for x in path.with_suffix(DROPPED_SUFFIX).read_bytes().splitlines()]
    assert dropped and all(d["bytes"] > 0 for d in dropped)
    kinds = {r.kind for r in records}
    assert {"transcript_rotated", "transcript_segment_dropped"} <= kinds
    # A writer reopened after rotation continues the numbering.
    with TranscriptWriter(path, max_bytes=64 * 1024, keep_segments=2) as w:
        assert w.next_seq == seqs[-1] + 1


def test_a_long_streamed_answer_costs_linear_not_quadratic_bytes(tmp_path: Path) -> None:
    from piwork.tasks.transcript import compact_pi_line

    delta = "word " * 20
    text = ""
    path = tmp_path / "transcript.jsonl"
    raw_total = 0
    with TranscriptWriter(path, max_bytes=1 << 40) as w:
        for _ in range(500):
            text += delta
            partial = {"role": "assistant", "content": [{"type": "text", "text": text}]}
            event = {
                "type": "message_update",
                "message": partial,
                "assistantMessageEvent": {
                    "type": "text_delta",
                    "contentIndex": 0,
                    "delta": delta,
                    "partial": partial,
                },
            }
            raw_total += len(orjson.dumps(event))
            w.append("pi", compact_pi_line(event))
        final = {"type": "message_end", "message": partial}
        w.append("pi", compact_pi_line(final))
    stored = path.stat().st_size
    assert raw_total > 50 * len(text)  # what storing every line verbatim costs
    assert stored < 4 * len(text) + 500 * 200, (stored, len(text))
    # Nothing is lost: the deltas rebuild the answer, and the final message is whole.
    records, _ = read_records(path)
    rebuilt = "".join(
        r.data["assistantMessageEvent"]["delta"]
        for r in records
        if r.data.get("type") == "message_update"
    )
    assert rebuilt == text
    assert records[-1].data["message"]["content"][0]["text"] == text
