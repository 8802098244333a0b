"""One download of a catalogue model into its part file: resumed where the part file ends, or started over.

Why its own module: the HTTP side of `depthwatch models fetch` (Range
requests, a server that cannot resume or resumes at the wrong place, a
connection cut short, a progress bar) is apart from what `fetch` does with
the bytes once they are in (the checks, the rename, the recorded checksum).
What fails here is one line that says what to do: DownloadError (exit 69),
FolderError (exit 73).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import re
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any, BinaryIO

from depthwatch import __version__
from depthwatch.errors import DepthwatchError
from depthwatch.model.catalogue import Entry

# The fetch's own logger: a download's lines belong to the fetch that started it.
log = logging.getLogger("depthwatch.model.fetch")

EX_UNAVAILABLE = 69
EX_CANTCREAT = 73

#: Seconds a connection may stay silent (connecting, or between two reads) before giving up.
DEFAULT_TIMEOUT = 30.0
_CHUNK = 1 << 20
_USER_AGENT = f"depthwatch/{__version__} (+models fetch)"
_CONTENT_RANGE = re.compile(r"^bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)$")


class DownloadError(DepthwatchError):
    """The model could not be downloaded: offline, unreachable, the server failed, or cut short."""

    exit_code = EX_UNAVAILABLE


class Unreachable(DownloadError):
    """The download could not start: offline, the host unreachable, or the server refused it.

    `reason`: why, in a few words, for a message that goes on to say more.
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class FolderError(DepthwatchError):
    """The model folder cannot be created or written."""

    exit_code = EX_CANTCREAT


class Download:
    """One transfer into the part file: resumes what is there, or starts it over."""

    def __init__(self, entry: Entry, target: Path, handle: BinaryIO, timeout: float, progress: IO[str] | None) -> None:
        self.entry = entry
        self.target = target
        self.handle = handle
        self.timeout = timeout
        self.progress = progress
        self.digest = hashlib.sha256()
        handle.seek(0)
        while chunk := handle.read(_CHUNK):
            self.digest.update(chunk)
        #: Bytes in the part file now; where this transfer started; bytes it received.
        self.size = handle.tell()
        self.start = self.size
        self.received = 0

    def run(self) -> None:
        """Receive the rest of the file into the part file (DownloadError, FolderError on failure)."""
        if self.size:
            log.info("resuming %s at byte %d from %s", self.entry.name, self.size, self.entry.url)
        else:
            log.info("downloading %s from %s", self.entry.name, self.entry.url)
        response, total = self._open()
        if response is None:
            return  # the part file already held every byte
        with response:
            self._copy(response, total)
        if total is not None and self.size != total:
            raise DownloadError(
                f"the download of {self.entry.name} stopped after {self.size} of {total} bytes "
                f"(the server closed the connection); run the same command again to resume"
            )

    def _restart(self) -> None:
        self.handle.truncate(0)
        self.digest = hashlib.sha256()
        self.size = self.start = 0

    def _open(self) -> tuple[Any, int | None]:
        """The response to read from, and the full size of the file when the server says it."""
        headers = {"User-Agent": _USER_AGENT, "Accept-Encoding": "identity"}
        if self.size:
            headers["Range"] = f"bytes={self.size}-"
        request = urllib.request.Request(self.entry.url, headers=headers)
        try:
            response = urllib.request.urlopen(request, timeout=self.timeout)  # noqa: S310 - http(s) only, checked in the catalogue
        except urllib.error.HTTPError as exc:
            try:
                if exc.code == 416 and self.size:
                    total = _content_range(exc.headers.get("Content-Range"))[1]
                    if total == self.size:
                        return None, total  # an earlier try got every byte but stopped before the checks
                    log.info("the server cannot resume %s; starting it over", self.entry.name)
                    self._restart()
                    return self._open()
                raise self._failed(f"the server answered HTTP {exc.code} {exc.reason}", "try again later") from None
            finally:
                exc.close()
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise self._failed(reason(exc), "check the internet connection") from None
        if response.status == 206 and self.size:
            start, total = _content_range(response.headers.get("Content-Range"))
            if start == self.size:
                return response, total
            response.close()
            log.info("the server resumed %s at the wrong place; starting it over", self.entry.name)
            self._restart()
            return self._open()
        if response.status != 200:
            response.close()
            raise self._failed(f"the server answered HTTP {response.status} {response.reason}", "try again later")
        if self.size:
            log.info("the server cannot resume %s; starting it over", self.entry.name)
            self._restart()
        length = response.headers.get("Content-Length")
        return response, int(length) if length and length.isdigit() else None

    def _copy(self, response: Any, total: int | None) -> None:
        with self._bar(total) as bar:
            while True:
                try:
                    chunk = response.read(_CHUNK)
                except (OSError, http.client.HTTPException) as exc:
                    got = f"{self.size} of {total}" if total is not None else str(self.size)
                    raise DownloadError(
                        f"the download of {self.entry.name} stopped after {got} bytes ({reason(exc)}); "
                        "run the same command again to resume"
                    ) from None
                if not chunk:
                    return
                try:
                    self.handle.write(chunk)
                except OSError as exc:
                    raise FolderError(f"cannot write to the model folder {self.target.parent}: {reason(exc)}") from None
                self.digest.update(chunk)
                self.size += len(chunk)
                self.received += len(chunk)
                bar.update(len(chunk))

    def _bar(self, total: int | None) -> Any:
        # No tqdm at all without a bar to show: even a disabled one starts a monitor thread it never ends.
        if self.progress is None:
            return contextlib.nullcontext(_NoBar())
        from tqdm import tqdm

        return tqdm(
            total=total,
            initial=self.size,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=self.entry.name,
            file=self.progress,
            dynamic_ncols=True,
        )

    def _failed(self, reason: str, advice: str) -> Unreachable:
        return Unreachable(
            f"cannot download {self.entry.name} from {self.entry.url}: {reason}; "
            f"{advice} or put the file at {self.target} yourself",
            reason,
        )


class _NoBar:
    def update(self, n: int) -> None:
        pass


def _content_range(value: str | None) -> tuple[int | None, int | None]:
    """(first byte, full size) from a Content-Range header; None where it does not say."""
    match = _CONTENT_RANGE.match((value or "").strip())
    if not match:
        return None, None
    start = int(match.group(1)) if match.group(1) else None
    total = int(match.group(3)) if match.group(3) != "*" else None
    return start, total


def reason(exc: BaseException) -> str:
    """Why a network or file operation failed, in a few lower-case words."""
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        inner = exc.reason
        if isinstance(inner, BaseException):
            return reason(inner)
        return str(inner)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"the server's certificate could not be verified ({exc.verify_message}); with Python from "
            "python.org on macOS, run its 'Install Certificates.command' once"
        )
    if isinstance(exc, socket.gaierror):
        return f"the host name could not be resolved ({exc.strerror})"
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return "the connection timed out"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "the server closed the connection without answering"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[0].lower() + exc.strerror[1:]
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
