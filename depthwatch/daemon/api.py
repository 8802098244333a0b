"""The HTTP API: the classic plugins' `POST /predict`, served from the daemon's one session.

Final Cut Pro setups built on the classic local Flask example write
`tmp/frame.jpg`, send `POST http://127.0.0.1:5000/predict` with no body and read
`tmp/depth.jpg` once the answer comes. Served here by waitress, a threaded WSGI
server that never forks, in the daemon's own process: the request hands the
frame to the daemon's queue (or attaches to the job the watcher already made)
and answers `DONE` once that version's map is on disk. An image body is
answered with its depth map and writes nothing.

Waitress reads a whole request before a request thread sees it and buffers the
answer, so a slow or stuck client holds only its own connection, never the
inference thread, the workers or the watcher. Request threads only wait, and
at most WAITING of them at once, so a few are always free for `/health` and for
the 503 that turns away a request beyond them. A wait ends at `api.timeout_s`,
when the client hangs up (waitress reads on while a request runs, so it sees
that), or when the daemon stops; then an image's job is stopped where it is,
so abandoned requests never queue work ahead of a frame someone waits for.

The server itself, waitress on a loop thread of ours with its connections
policed, is `apiserver`'s; only that module imports waitress, and only when
`api.enabled` (the `api` extra). This one is the plain WSGI application.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs

from depthwatch.config import ApiConfig
from depthwatch.daemon.waiters import DONE, FAILED, TIMEOUT, Ticket
from depthwatch.errors import DepthwatchError, FrameError
from depthwatch.frames import ownership
from depthwatch.frames.folders import inside
from depthwatch.frames.frameline import timings
from depthwatch.frames.result import Result
from depthwatch.frames.rules import Rules
from depthwatch.imaging import formats
from depthwatch.logtext import one_line, shown

log = logging.getLogger("depthwatch.daemon.api")

#: Request threads. They only wait (for a map, or an in-memory job), so more than the
#: cores is fine; requests beyond them wait in waitress's queue.
THREADS = 16
#: `POST /predict` requests waiting at once at most (for a map, or a slot for an image
#: body); one beyond them is answered 503 at once. The other threads stay free for
#: `/health` and those answers.
WAITING = THREADS - 2
#: How often a waiting request looks whether its client is still there.
_CHECK_S = 0.1

#: Body content types taken as images, and the answer formats (`?format=` or Accept).
IMAGE_TYPES = {"image/jpeg": formats.JPEG, "image/jpg": formats.JPEG, "image/png": formats.PNG}
ANSWER_FORMATS = {"jpg": (".jpg", None), "jpeg": (".jpg", None), "png": (".png", None), "png8": (".png", 8), "png16": (".png", 16)}
_GLOB = set("*?[")
#: The longest file name (each part of a path), in bytes, on the file systems of macOS and Linux.
NAME_MAX = 255

StartResponse = Callable[..., Any]


class Backend(Protocol):
    """What the API needs from the daemon (see `backend.ApiBackend`, the small object the daemon builds for it)."""

    @property
    def rules(self) -> Rules: ...

    @property
    def stopping(self) -> bool: ...

    def request_map(self, source: Path) -> Ticket: ...

    def render_image(
        self, data: bytes, ext: str, png_bits: int | None = None, timeout: float | None = None
    ) -> Future[Result]: ...

    def give_up(self, waited: Ticket | Future[Result]) -> None: ...

    def health(self) -> tuple[bool, bytes]: ...


class Refused(Exception):
    """A request answered with an error: `status` and one line saying what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


#: Each status code's reason phrase (RFC 9110's words), for the app's answers and waitress's own refusals alike.
REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    499: "Client Closed Request",
    500: "Internal Server Error",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


#: How a request's wait ended.
_READY, _GONE, _TIMEOUT, _STOPPED = "ready", "gone", "timeout", "stopped"
_STOPPING = "the daemon is stopping; try again once it is back"


class PredictApp:
    """The WSGI application: `POST /predict` and `GET /health`."""

    def __init__(self, backend: Backend, config: ApiConfig) -> None:
        self.backend = backend
        self.config = config
        self.max_body = int(config.max_body_mb * 1024 * 1024)
        self._token = config.token.encode() if config.token else None
        self._waiting = threading.BoundedSemaphore(WAITING)
        #: Set by `release`: every wait ends now with 503.
        self._released = threading.Event()
        self._wakers: set[threading.Event] = set()
        self._wakers_lock = threading.Lock()

    def release(self) -> None:
        """The daemon is stopping and will not finish what is still waited for: answer 503 now."""
        self._released.set()
        with self._wakers_lock:
            for waker in self._wakers:
                waker.set()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "")
        query = environ.get("QUERY_STRING", "")
        what = shown(f"{method} {path}" + (f"?{query}" if query else ""))
        try:
            answer = self._route(method, path, query, environ)
        except Refused as exc:
            # One line, as logged: a name's newline escaped, and a name escaped already (`frame=...`, a
            # frame's own error) not escaped again.
            log.warning("api: %s: %d %s", what, exc.status, one_line(str(exc)))
            answer = _Answer(exc.status, f"{one_line(str(exc))}\n".encode())
            if exc.status == 401:
                answer = _Answer(401, answer.body, headers=(("WWW-Authenticate", 'Bearer realm="depthwatch"'),))
        except Exception as exc:  # a bug must cost one request, not the listener
            log.exception("api: %s: internal error", what)
            answer = _Answer(500, f"internal error: {type(exc).__name__}: {exc}\n".encode())
        headers = [("Content-Type", answer.content_type), ("Content-Length", str(len(answer.body))), *answer.headers]
        start_response(f"{answer.status} {REASONS.get(answer.status, '')}", headers)
        return [b""] if method == "HEAD" else [answer.body]  # HEAD: the headers alone (waitress sends what it is given)

    def _route(self, method: str, path: str, query: str, environ: dict[str, Any]) -> _Answer:
        self._authorise(environ)
        if path == "/health":
            if method not in ("GET", "HEAD"):
                raise Refused(405, "use GET /health")
            serving, body = self.backend.health()
            return _Answer(200 if serving else 503, body, "application/json")
        if path != "/predict":
            raise Refused(404, f"no such endpoint {path}; use POST /predict or GET /health")
        if method != "POST":
            raise Refused(405, "use POST /predict")
        if self.backend.stopping:
            raise Refused(503, _STOPPING)
        params = parse_qs(query, keep_blank_values=True)
        length = _content_length(environ)
        if length > self.max_body:
            raise Refused(413, self._too_large())
        if not self._waiting.acquire(blocking=False):
            raise Refused(503, f"{WAITING} requests are waiting already; try again shortly")
        try:
            if length > 0:
                return self._predict_body(environ, length, params)
            if _content_type(environ) in IMAGE_TYPES:  # an image sent empty, by mistake: not "the frame on disk"
                raise Refused(422, f"the {_content_type(environ)} body is empty; send the image, or no body to map the frame on disk")
            return self._predict_frame(params, environ)
        finally:
            self._waiting.release()

    def _authorise(self, environ: dict[str, Any]) -> None:
        if self._token is None:
            return
        given = environ.get("HTTP_AUTHORIZATION", "")
        scheme, _, credential = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(credential.strip().encode(), self._token):
            raise Refused(401, "missing or wrong token; send 'Authorization: Bearer <api.token>'")

    def _too_large(self) -> str:
        return f"the body is over api.max_body_mb ({self.config.max_body_mb:g} MB); send a smaller image or raise api.max_body_mb"

    # -- waiting ---------------------------------------------------------------------

    def _wait(self, environ: dict[str, Any], ready: Callable[[float], bool], deadline: float) -> str:
        """Call `ready(seconds)` until it is true (_READY), the client hangs up, time runs out or `release`.

        A client gone is looked for first: a request served after its client left starts nothing.
        """
        gone = environ.get("waitress.client_disconnected")
        while True:
            if gone is not None and gone():
                return _GONE
            if ready(max(0.0, min(_CHECK_S, deadline - time.monotonic()))):
                return _READY
            if self._released.is_set():
                return _STOPPED
            if time.monotonic() >= deadline:
                return _TIMEOUT

    def _waited_in_vain(self, how: str, what: str, after: str) -> Refused:
        """The refusal for a wait that did not end _READY; `after` says what became of the work."""
        if how == _STOPPED or self.backend.stopping:
            return Refused(503, _STOPPING)
        if how == _GONE:
            return Refused(499, f"the client went away before the answer; {after}")
        return Refused(504, f"no depth map {what}within api.timeout_s ({self.config.timeout_s:g} s); the daemon may be overloaded; {after}")

    # -- a frame on disk -------------------------------------------------------------

    def _predict_frame(self, params: dict[str, list[str]], environ: dict[str, Any]) -> _Answer:
        rules = self.backend.rules
        names = params.get("frame")
        source = self._resolve(names[-1], rules) if names else self._default_frame(rules)
        if source.exists() and not source.is_file():
            raise Refused(404, f"{source} is not a file")
        try:
            ticket = self.backend.request_map(source)
        except FileNotFoundError:
            raise Refused(404, f"no such frame {source}; write it first") from None
        except FrameError as exc:
            raise Refused(403, f"{source}: {exc}") from None
        how = self._wait(environ, lambda seconds: ticket.wait(seconds).kind != TIMEOUT, time.monotonic() + self.config.timeout_s)
        if how != _READY:
            self.backend.give_up(ticket)
            raise self._waited_in_vain(how, f"for {source.name} ", "its map is made all the same")
        outcome = ticket.wait(0)
        if outcome.kind == DONE:
            return _Answer(200, b"DONE")
        if outcome.kind == FAILED and outcome.model_fault:
            raise Refused(503, f"the model is failing: {source.name}: {outcome.error}")
        if outcome.kind == FAILED:
            # The frame cannot be used: 422. Its map cannot be written (a file of the user's in its way,
            # a folder depthwatch may not write): 409, a conflict with what is on disk, not a bad image.
            raise Refused(422 if outcome.frame_error else 409, f"{source.name}: {outcome.error}")
        if self.backend.stopping:
            raise Refused(503, _STOPPING)
        raise Refused(503, outcome.error or "the daemon is stopping")

    def _default_frame(self, rules: Rules) -> Path:
        """The classic frame: the first watch folder's first pattern, if it names one file."""
        if not rules.roots or not rules.patterns:
            raise Refused(404, "no watch folder is configured")
        pattern = rules.patterns[0]
        if _GLOB & set(pattern) or "/" in pattern:
            raise Refused(404, f"watch.patterns starts with {pattern!r}, not a file name; name the frame: POST /predict?frame=NAME")
        return rules.roots[0] / pattern

    def _resolve(self, name: str, rules: Rules) -> Path:
        """`frame=NAME` as a frame inside a watch folder; 403 for anything that leads outside."""
        if not name or "\x00" in name:
            raise Refused(403, f"frame={shown(name)!s} is not a file name")
        longest = max((len(os.fsencode(part)) for part in Path(name).parts), default=0)
        if longest > NAME_MAX:
            raise Refused(
                403, f"frame={shown(name)} is not a file name: a name in it is {longest} bytes, over the {NAME_MAX} a file name can have"
            )
        if os.path.isabs(name):
            candidates = [Path(os.path.abspath(name))]
        else:
            candidates = [Path(os.path.abspath(root / name)) for root in rules.roots]
        if any(path in rules.roots for path in candidates):
            raise Refused(403, f"frame={shown(name)} is a watch folder, not a frame in one")
        inside = [path for path in candidates if _contained(path, rules)]
        if not inside:
            raise Refused(403, f"frame={shown(name)} is outside the watch folders")
        try:
            path = next((p for p in inside if p.exists()), inside[0])
        except OSError as exc:  # a path longer than the system takes (ENAMETOOLONG), a loop of links
            raise Refused(403, f"frame={shown(name)} is not a file name: {exc.strerror or exc}") from None
        if not rules.link_allowed(path):
            raise Refused(403, f"{path} is a symlink to outside its watch folder")
        if rules.is_own_file(path):
            if rules.named_as_map(path) and path.is_file() and not ownership.is_depth_map(path):
                raise Refused(
                    403, f"{path.name} is named as output.template names depth maps ({rules.template}), so it is "
                    "never taken as a frame; rename it to map it"
                )
            raise Refused(403, f"{path.name} is one of depthwatch's own files (an output or a temporary file), not a frame")
        if not rules.is_frame(path):
            if path.name.startswith(".") and rules.root_of(path) is not None:
                raise Refused(
                    403, f"{path.name} is a hidden file (its name starts with a dot), never taken as a frame unless "
                    "watch.patterns names hidden files (.*.jpg)"
                )
            raise Refused(403, f"{path.name} does not match watch.patterns ({', '.join(rules.patterns)})")
        return path

    # -- an image in the body ---------------------------------------------------------

    def _predict_body(self, environ: dict[str, Any], length: int, params: dict[str, list[str]]) -> _Answer:
        content_type = _content_type(environ)
        if content_type not in IMAGE_TYPES:
            raise Refused(415, f"the body is {content_type or 'untyped'}, not an image; send Content-Type image/jpeg or image/png")
        ext, bits, label = self._answer_format(params, environ.get("HTTP_ACCEPT", ""))
        data = environ["wsgi.input"].read(length)
        if len(data) > self.max_body:
            raise Refused(413, self._too_large())
        start = time.perf_counter()
        deadline = time.monotonic() + self.config.timeout_s
        try:
            future = self._start_image(environ, deadline, data, ext, bits)
            log.debug("api: image body of %d bytes: its job has begun", len(data))
            done = threading.Event()
            future.add_done_callback(lambda _: done.set())
            with self._wakers_lock:
                self._wakers.add(done)
            try:
                how = self._wait(environ, lambda seconds: done.wait(seconds) and future.done(), deadline)
            finally:
                with self._wakers_lock:
                    self._wakers.discard(done)
            if how != _READY:
                self.backend.give_up(future)  # nobody will read it: the model moves on
                raise self._waited_in_vain(how, "", "its job was stopped")
            result = future.result()
        except CancelledError:  # the daemon stopped before it ran
            raise Refused(503, _STOPPING) from None
        except (DepthwatchError, RuntimeError) as exc:  # the pipeline was already shut down
            if self.backend.stopping:
                raise Refused(503, _STOPPING) from None
            raise Refused(500, f"{exc}") from None
        if not result.ok or result.data is None:
            if self.backend.stopping:
                raise Refused(503, _STOPPING)
            if result.bad_prediction:  # the model's fault, not the body's
                raise Refused(503, f"the model is failing: {result.error}")
            if result.frame_at_fault:
                raise Refused(422, f"the {content_type} body cannot be used: {result.error}")
            raise Refused(500, f"{result.error}")
        w, h = result.size or (0, 0)
        log.info("api: image body %dx%d -> %s ms: %s total %.1f", w, h, label, timings(result.ms), (time.perf_counter() - start) * 1000)
        mime = "image/jpeg" if ext == ".jpg" else "image/png"
        return _Answer(200, result.data, mime, (("X-Depthwatch-Size", f"{w}x{h}"),))

    def _start_image(self, environ: dict[str, Any], deadline: float, data: bytes, ext: str, bits: int | None) -> Future[Result]:
        """The image's job, once the pipeline has a slot for it (images never take the last one)."""
        started: list[Future[Result]] = []

        def start(seconds: float) -> bool:
            if self.backend.stopping:
                raise Refused(503, _STOPPING)  # not begun: no new work once the stop has begun
            try:
                started.append(self.backend.render_image(data, ext, bits, timeout=seconds))
            except TimeoutError:
                return False
            return True

        how = self._wait(environ, start, deadline)
        if how != _READY:
            raise self._waited_in_vain(how, "", "its job had not begun")
        return started[0]

    def _answer_format(self, params: dict[str, list[str]], accept: str) -> tuple[str, int | None, str]:
        chosen = params.get("format")
        if chosen:
            key = chosen[-1].lower()
            if key not in ANSWER_FORMATS:
                raise Refused(400, f"format={shown(key)} is not one of {', '.join(ANSWER_FORMATS)}")
            ext, bits = ANSWER_FORMATS[key]
            return ext, bits, key
        for item in accept.split(","):
            mime = item.split(";", 1)[0].strip().lower()
            if mime == "image/png":
                return ".png", None, "png"
            if mime in ("image/jpeg", "image/jpg", "image/*", "*/*"):
                break
        return ".jpg", None, "jpg"


def _contained(path: Path, rules: Rules) -> bool:
    """Inside a watch folder by name and by real path (a symlinked subfolder must not lead out)."""
    root = rules.root_of(path)
    if root is None:
        return False
    return inside(path.parent, (root,))


def _content_type(environ: dict[str, Any]) -> str:
    return str(environ.get("CONTENT_TYPE", "")).split(";", 1)[0].strip().lower()


def _content_length(environ: dict[str, Any]) -> int:
    try:
        return max(0, int(environ.get("CONTENT_LENGTH") or 0))
    except ValueError:
        raise Refused(400, "the Content-Length header is not a number") from None
