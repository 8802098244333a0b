"""Downloading a catalogue model into the model folder without ever leaving a bad file in its place.

The bytes go to a hidden `.FILE.part` beside the model, so an interrupted
download resumes from there (an HTTP Range request) on the next try. The part
file becomes the model in one rename, and only after its size, its sha256 and
an ONNX load check (through the engine's own loading code) have passed: the
daemon, or a model already there, never sees anything in between.

Where the catalogue publishes no checksum, the first download records the
sha256 it got in `FILE.sha256` beside the model (the format `shasum -a 256 -c`
reads), and every later check compares against that: trust on first use.

A file already in the model's place that is not the model (another sha256, or
no model at all) is replaced by a fresh download; where none can be had
(offline), it is refused with exit 65 and what to do with it: remove it, or
keep it with `--accept`, which records its sha256 in `FILE.sha256` so later
checks take it for the model (until `--force` downloads the catalogue's).

Exit codes (sysexits.h), each with a one-line message:
  69 EX_UNAVAILABLE  no network, the server failed or the download was cut short (retry resumes)
  65 EX_DATAERR      the bytes are wrong: size, sha256 or not a loadable ONNX model (nothing changed)
  73 EX_CANTCREAT    the model folder cannot be written
  75 EX_TEMPFAIL     another fetch is downloading the same model right now

This module holds the file's side: what a model's bytes must hash to, the
records beside it, whether a copy is kept or replaced, and the checks before
the rename. The transfer itself (HTTP, Range requests, the progress bar) is
`download`'s; its errors are named here too (`__all__`), so a caller catches
everything `fetch` raises from this one module.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

from depthwatch.errors import DepthwatchError
from depthwatch.files import atomic_write, sha256_of
from depthwatch.model.catalogue import Entry
from depthwatch.model.download import (
    DEFAULT_TIMEOUT,
    EX_CANTCREAT,
    EX_UNAVAILABLE,
    Download,
    DownloadError,
    FolderError,
    Unreachable,
    reason,
)

log = logging.getLogger("depthwatch.model.fetch")

EX_DATAERR = 65
EX_TEMPFAIL = 75

_SHA256 = re.compile(r"^[0-9a-f]{64}$")

__all__ = [
    "DEFAULT_TIMEOUT",
    "EX_CANTCREAT",
    "EX_DATAERR",
    "EX_TEMPFAIL",
    "EX_UNAVAILABLE",
    "BusyError",
    "DownloadError",
    "Fetched",
    "FolderError",
    "IntegrityError",
    "Unreachable",
    "accepted_sha256",
    "checksum_file",
    "expected_sha256",
    "fetch",
    "human_size",
    "part_file",
    "recorded_sha256",
    "size_doubt",
    "state",
]


class IntegrityError(DepthwatchError):
    """The downloaded bytes are not the model: wrong size or sha256, or not a loadable ONNX model."""

    exit_code = EX_DATAERR


class BusyError(DepthwatchError):
    """Another process is downloading the same model into the same folder."""

    exit_code = EX_TEMPFAIL


@dataclass(frozen=True)
class Fetched:
    """What `fetch` left in the model folder."""

    path: Path
    sha256: str
    size: int
    #: Bytes transferred by this call (0: a verified copy was already there).
    downloaded: int
    #: Where this call's transfer started (non-zero: it resumed an interrupted one).
    resumed_from: int
    #: The file was kept as it is with `accept`, though its sha256 is not the expected one.
    accepted: bool = False


def checksum_file(model: Path) -> Path:
    """`FILE.sha256` beside `model`: the sha256 recorded for a model whose catalogue entry has none."""
    return model.with_name(model.name + ".sha256")


def part_file(model: Path) -> Path:
    """Where a download of `model` collects its bytes (hidden, so no watcher or user takes it)."""
    return model.with_name(f".{model.name}.part")


def recorded_sha256(model: Path) -> str | None:
    """The sha256 in the checksum file beside `model`, or None if there is none."""
    record = checksum_file(model)
    try:
        text = record.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"cannot read {record}: {exc}; delete it to record a new checksum") from None
    words = text.split()
    if not words or not _SHA256.match(words[0].lower()):
        raise IntegrityError(f"{record} does not hold a sha256; delete it to record a new checksum")
    return words[0].lower()


def expected_sha256(entry: Entry, model: Path) -> str | None:
    """What the model's bytes must hash to: the catalogue's checksum, else the recorded one."""
    return entry.sha256 or recorded_sha256(model)


#: A file outside this factor of the catalogue's rough size is not taken for the model without asking.
SIZE_TOLERANCE = 2.0


def size_doubt(entry: Entry, size: int) -> str | None:
    """Why a file of `size` bytes is probably not `entry`'s model, or None if its size fits.

    Exact where the catalogue knows the size; otherwise within SIZE_TOLERANCE of
    `approx_mb` (a stand-in of 1 MB named like a 64 MB model is caught; exports of
    the same weights differ by far less).
    """
    if entry.size is not None:
        return None if size == entry.size else f"is {human_size(size)}, not the {entry.size} bytes the catalogue expects"
    if not entry.approx_mb:
        return None
    expected = entry.approx_mb * (1 << 20)
    if expected / SIZE_TOLERANCE <= size <= expected * SIZE_TOLERANCE:
        return None
    return f"is {human_size(size)}, far from the ~{entry.approx_mb:g} MB of {entry.title or entry.name}"


def human_size(size: int) -> str:
    if size >= 1 << 20:
        return f"{size / (1 << 20):.1f} MB"
    return f"{size} bytes"


def accepted_sha256(entry: Entry, model: Path) -> str | None:
    """The sha256 `--accept` recorded for a file kept in place of a model the catalogue has a checksum for."""
    return recorded_sha256(model) if entry.sha256 is not None else None


def state(entry: Entry, folder: Path) -> str:
    """missing, ok (matches its checksum), accepted (kept with `--accept`), changed (matches
    neither), or unverified (nothing to compare with)."""
    model = folder / entry.file
    if not model.is_file():
        return "missing"
    expected = expected_sha256(entry, model)
    if expected is None:
        return "unverified"
    sha256 = sha256_of(model)
    if sha256 == expected:
        return "ok"
    return "accepted" if sha256 == accepted_sha256(entry, model) else "changed"


def fetch(
    entry: Entry,
    folder: Path,
    *,
    force: bool = False,
    accept: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    progress: IO[str] | None = None,
) -> Fetched:
    """Make `folder/entry.file` a verified copy of the catalogue model, downloading only if needed.

    A copy already there that matches its checksum is kept (unless `force`); a
    hand-placed one with nothing to compare against is adopted once it loads,
    and its sha256 recorded, unless its size says it is another model (then
    `accept` records it anyway). One that does not match, or does not load, is
    downloaded again; if that cannot start (offline), IntegrityError says what
    to do with it; with `accept` it is kept, its sha256 recorded, without a
    download. `progress` receives a progress bar (None: none).
    """
    target = folder / entry.file
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FolderError(f"cannot create the model folder {folder}: {reason(exc)}; choose another with --folder or model.folder") from None
    expected = expected_sha256(entry, target)
    wrong: str | None = None  # what is wrong with the file in the model's place, to be replaced
    if target.is_file() and not force:
        kept = _keep_existing(entry, target, expected, accept)
        if isinstance(kept, Fetched):
            return kept
        wrong = kept
    part = part_file(target)
    try:
        handle = open(part, "a+b")  # noqa: SIM115 - held open (and locked) until the rename
    except OSError as exc:
        raise FolderError(f"cannot write to the model folder {folder}: {reason(exc)}; choose another with --folder or model.folder") from None
    with handle:
        _lock(handle, entry, folder)
        download = Download(entry, target, handle, timeout, progress)
        try:
            download.run()
        except DepthwatchError as exc:
            if download.size == 0:
                part.unlink(missing_ok=True)  # nothing to resume from
            if wrong is not None and isinstance(exc, Unreachable):
                raise IntegrityError(
                    f"{wrong}, and no copy to replace it could be downloaded ({exc.reason}); remove it and fetch "
                    f"{entry.name} again online, or keep it with `depthwatch models fetch {entry.name} --accept`"
                ) from None
            raise
        try:
            handle.flush()
            os.fsync(handle.fileno())
        except OSError as exc:
            raise FolderError(f"cannot write to the model folder {folder}: {reason(exc)}") from None
        sha256 = download.digest.hexdigest()
        try:
            _check(entry, part, download.size, sha256, expected, target)
        except IntegrityError:
            part.unlink(missing_ok=True)
            raise
        try:
            os.replace(part, target)
        except OSError as exc:
            raise FolderError(f"cannot put the model in place at {target}: {reason(exc)}") from None
    if entry.sha256 is None:
        _record_checksum(target, sha256)
    else:
        _forget_accepted(target)  # the catalogue's own copy is there now
    log.debug("saved %s (%d bytes, sha256 %s)", target, download.size, sha256)
    return Fetched(target, sha256, download.size, download.received, download.start)


def _keep_existing(entry: Entry, target: Path, expected: str | None, accept: bool = False) -> Fetched | str:
    """The Fetched for a good copy already in place; else what is wrong with it, for a download to replace it.

    A hand-placed copy (nothing to compare its checksum with) whose size is far
    from the catalogue's is refused rather than recorded as the truth. With
    `accept`, a copy that does not match its sha256 is kept once it loads, and
    its sha256 recorded.
    """
    sha256 = sha256_of(target)
    size = target.stat().st_size
    if expected is not None:
        if sha256 in (expected, accepted_sha256(entry, target)):
            return Fetched(target, sha256, size, 0, 0, accepted=sha256 != expected)
        where = "the catalogue's" if entry.sha256 is not None else f"the one recorded in {checksum_file(target).name}"
        if not accept:
            log.warning("%s does not match the sha256 of %s (%s); downloading it again", target, entry.name, where)
            return f"{target} does not match the sha256 of {entry.name} ({where}): another model, or a damaged copy"
        _adopt(entry, target, sha256)
        return Fetched(target, sha256, size, 0, 0, accepted=True)
    doubt = size_doubt(entry, size)
    if doubt is not None and not accept:
        raise IntegrityError(
            f"{target} {doubt}, so it is probably another model; nothing was recorded. Delete it and fetch "
            f"{entry.name} online, or if it is the right file, `depthwatch models fetch {entry.name} --accept`"
        )
    try:
        _load_check(entry, target)
    except IntegrityError as exc:
        log.warning("%s cannot be used (%s); downloading it again", target, exc)
        return f"{target} is not a usable model ({exc})"
    _record_checksum(target, sha256)
    log.debug("kept %s, which was already there; recorded its sha256 %s", target, sha256)
    return Fetched(target, sha256, size, 0, 0)


def _adopt(entry: Entry, target: Path, sha256: str) -> None:
    """Record the sha256 of the file in the model's place, kept with `--accept`, once it loads."""
    try:
        _load_check(entry, target)
    except IntegrityError as exc:
        raise IntegrityError(
            f"{target} is not a usable model ({exc}); nothing was recorded. Remove it and fetch {entry.name} online"
        ) from None
    _record_checksum(target, sha256)


def _forget_accepted(target: Path) -> None:
    """Remove the record of a file kept with `--accept`, now that the catalogue's copy replaced it."""
    record = checksum_file(target)
    try:
        record.unlink(missing_ok=True)
    except OSError as exc:
        raise FolderError(f"cannot remove {record}, which names the file replaced: {reason(exc)}") from None


def _check(entry: Entry, part: Path, size: int, sha256: str, expected: str | None, target: Path) -> None:
    kept = "the download was discarded" + (f" and {target.name} left as it was" if target.exists() else "")
    if entry.size is not None and size != entry.size:
        raise IntegrityError(f"{entry.name} from {entry.url} is {size} bytes, not the {entry.size} the catalogue expects; {kept}")
    if expected is not None and sha256 != expected:
        if entry.sha256 is not None:
            where = "the catalogue's"
            what_now = "the file on the server is not the one the catalogue names"
        else:
            where = f"the one recorded in {checksum_file(target)}"
            what_now = f"the file on the server has changed; delete {checksum_file(target).name} to accept it"
        raise IntegrityError(f"checksum mismatch for {entry.name}: got sha256 {sha256}, not {where} ({expected}); {kept}; {what_now}")
    try:
        _load_check(entry, part)
    except IntegrityError as exc:
        raise IntegrityError(f"{entry.name} from {entry.url} is not a usable ONNX model ({exc}); {kept}") from None


def _load_check(entry: Entry, path: Path) -> None:
    """Load the model and run it once, through the engine's one code path, on CPU.

    CPU only: the point is whether the file is a working model, and a CoreML
    compile of a temporary file would only fill the cache with a copy nobody
    reuses.
    """
    from depthwatch.model import providers
    from depthwatch.model.engine import Engine
    from depthwatch.model.profiles import PROFILES
    from depthwatch.model.spec import ModelSpec

    engine = Engine(ModelSpec(path=path, profile=PROFILES[entry.profile], providers=(providers.CPU,))).start()
    try:
        engine.wait_ready()
    except DepthwatchError as exc:
        raise IntegrityError(str(exc)) from None
    finally:
        engine.stop()


def _lock(handle: BinaryIO, entry: Entry, folder: Path) -> None:
    import fcntl

    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise BusyError(f"another `depthwatch models fetch {entry.name}` is downloading into {folder}; wait for it to finish") from None


def _record_checksum(target: Path, sha256: str) -> None:
    """`FILE.sha256` beside the model, in the format `shasum -a 256 -c` reads."""
    record = checksum_file(target)
    try:
        atomic_write(record, f"{sha256}  {target.name}\n".encode())
    except OSError as exc:
        raise FolderError(f"cannot record the checksum in {record}: {reason(exc)}") from None

