"""The API's server: waitress on a loop thread of our own, its connections policed, stopped on our terms.

Connections are a resource a local program can hoard: waitress stops accepting
at its connection limit, so 100 idle, half-sent connections would lock every
plugin out, and a byte every few seconds defeats its idle timeout. So, on the
loop thread between polls: a request must arrive whole within `api.request_timeout_s`
of its first byte (trickling does not extend it), and at the limit, while a new
connection is waiting, the connection that has waited longest without a request
in flight is closed to make room.

Waitress, not cheroot. Cheroot has the public `stop()` waitress lacks, and a
timeout per connection; but its timeout is per socket read, so a trickle
defeats it as it does waitress's, and the whole-request deadline and the
eviction at the limit would still be ours to write; and it does not read on
while a request runs, so a client hanging up (`waitress.client_disconnected`,
which ends an image's job at once) would go unseen until the answer is sent.
The code would not get simpler, and the API's tests pin waitress's behaviour
(its 413 before the app runs, its queue beyond the threads). So waitress stays,
driven through its loop and pinned (see `ApiServer`).

Only this module imports waitress, and only when `api.enabled` (the `api` extra).
"""

from __future__ import annotations

import logging
import select
import threading
from collections.abc import Callable
import time
from typing import Any

from waitress import wasyncore
from waitress.channel import HTTPChannel
from waitress.server import create_server
from waitress.task import ErrorTask

from depthwatch.config import ApiConfig
from depthwatch.daemon.api import REASONS, THREADS, Backend, PredictApp
from depthwatch.daemon.listening import bind_host
from depthwatch.logtext import shown
from depthwatch.threadnames import name_this_thread

log = logging.getLogger("depthwatch.daemon.api")

#: An idle keep-alive connection is closed after this long.
CHANNEL_TIMEOUT_S = 60
#: Open connections at most; at the limit the stalest idle one makes room for a new one.
CONNECTION_LIMIT = 100
#: How often overdue requests are looked for, and evictions summed up in the log.
_POLICE_S = 1.0


class _LoggedErrorTask(ErrorTask):
    """Requests waitress refuses itself (body over the limit, malformed): one log line, and the same
    sentence as the answer's one-line body, as the app's own refusals (not waitress's three lines)."""

    def execute(self) -> None:
        error = self.request.error
        limit = self.channel.server.adj.max_request_body_size
        if error.code == 413:
            error.body = f"the body is over api.max_body_mb ({limit / 1024 / 1024:.3g} MB); send a smaller image or raise api.max_body_mb"
        # A request line or header waitress could not parse leaves no command or path: read without a
        # default, they raise here, no answer goes out, and the connection stays open for good (100 such
        # lock every plugin out).
        command = getattr(self.request, "command", None) or "?"
        path = getattr(self.request, "path", None) or "?"
        if error.code == 431:  # headers too large: waitress parsed a stand-in request line, not the client's
            command = path = "?"
        sentence = shown(" ".join(str(error.body).split()))
        log.warning("api: %s %s: %d %s", shown(command), shown(path), error.code, sentence)
        body = f"{sentence}\n".encode()
        self.status = f"{error.code} {REASONS.get(error.code, error.reason)}"
        self.response_headers.append(("Content-Type", "text/plain; charset=utf-8"))
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


#: waitress's own notes ("connection limit reached", "canceling pending tasks") would reach
#: stderr raw through logging's last resort; the API makes room and answers itself, so only
#: its errors are worth a line, in the daemon's format.
_WAITRESS_LOG = logging.getLogger("depthwatch.daemon.api.waitress")


class _Channel(HTTPChannel):
    error_task_class = _LoggedErrorTask
    logger = _WAITRESS_LOG

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: When the request being received began (monotonic), or the connection was made.
        self.since = time.monotonic()
        super().__init__(*args, **kwargs)

    def received(self, data: bytes) -> bool:
        if self.request is None and data:
            self.since = time.monotonic()  # the first bytes of a new request
        return bool(super().received(data))

    @property
    def evictable(self) -> bool:
        """No request in flight and nothing being sent: closing it costs nobody an answer."""
        return not self.requests and not self.total_outbufs_len and not self.will_close

    @property
    def partial(self) -> bool:
        """Part of a request received, the rest still awaited."""
        return self.request is not None and self.evictable


#: How often the loop thread looks at the stop flags between network events.
_LOOP_TICK_S = 0.1
#: At a stop, the least time the answers already decided (503s) get to go out.
_HANDOVER_S = 0.5


class ApiServer:
    """Waitress on its own loop thread ("depthwatch-api") with THREADS request threads.

    The loop is waitress's own (`wasyncore.loop`), run one poll at a time so
    that closing the listener and the connections happens on the loop's thread,
    between polls, when the daemon's shutdown asks for it. Waitress offers no
    public way to stop a server (its maintainers say so: Pylons/waitress#343,
    Pylons/waitress#372; `server.close()` from another thread races the loop), so this uses
    its internals (`_map`, `wasyncore`); the version is pinned to the 3.0 series
    and tests/test_api.py checks each one the day the pin is raised.
    """

    def __init__(self, backend: Backend, config: ApiConfig, beat: Callable[[], None] = lambda: None) -> None:
        """`beat`: called by the loop thread at each turn, the supervisor's proof that it still turns."""
        self._beat = beat
        self.config = config
        self.app = PredictApp(backend, config)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._deaf = threading.Event()
        self._closing = threading.Event()
        self._evicted = 0
        self.url = ""

    def start(self) -> None:
        """Bind and serve (OSError if the address is taken)."""
        host = bind_host(self.config.host)
        server = create_server(
            self.app,
            host=host,
            port=self.config.port,
            threads=THREADS,
            channel_timeout=CHANNEL_TIMEOUT_S,
            connection_limit=CONNECTION_LIMIT,
            max_request_body_size=self.app.max_body + 1,  # waitress refuses this size or more: the limit itself is allowed
            # Read on while a request runs, so a client hanging up is seen (waitress.client_disconnected).
            channel_request_lookahead=1,
            clear_untrusted_proxy_headers=True,
            expose_tracebacks=False,
            ident="depthwatch",
        )
        server.channel_class = _Channel
        _WAITRESS_LOG.setLevel(logging.ERROR)
        server.logger = server.task_dispatcher.logger = server.task_dispatcher.queue_logger = _WAITRESS_LOG
        self._server = server
        shown = f"[{server.effective_host}]" if ":" in server.effective_host else server.effective_host
        self.url = f"http://{shown}:{server.effective_port}"
        self._thread = threading.Thread(target=self._loop, name="depthwatch-api", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        name_this_thread()
        server = self._server
        channels = server._map
        use_poll = server.adj.asyncore_use_poll
        listening = True
        waiting = select.poll()
        waiting.register(server.socket.fileno(), select.POLLIN)
        next_police = time.monotonic() + _POLICE_S
        while channels:
            if self._closing.is_set():
                wasyncore.close_all(channels, ignore_all=True)
                return
            if listening and self._deaf.is_set():
                listening = False
                wasyncore.dispatcher.close(server)  # the listener only, not the trigger
            if listening and len(channels) >= CONNECTION_LIMIT and waiting.poll(0):
                self._make_room(channels)
            if time.monotonic() >= next_police:
                self._close_overdue(channels)
                next_police = time.monotonic() + _POLICE_S
            wasyncore.loop(timeout=_LOOP_TICK_S, use_poll=use_poll, map=channels, count=1)
            self._beat()

    def _make_room(self, channels: dict[int, Any]) -> None:
        """A connection is waiting at the limit: close the one that has waited longest for nothing."""
        idle = [c for c in channels.values() if isinstance(c, _Channel) and c.evictable]
        if idle:
            min(idle, key=lambda c: c.since).handle_close()
            self._evicted += 1

    def _close_overdue(self, channels: dict[int, Any]) -> None:
        """Close connections whose request has not arrived whole in time; one line for them all."""
        limit = self.config.request_timeout_s
        cutoff = time.monotonic() - limit
        overdue = [c for c in channels.values() if isinstance(c, _Channel) and c.partial and c.since < cutoff]
        for channel in overdue:
            channel.handle_close()
        if overdue:
            log.warning("api: closed %d connection(s) whose request did not arrive whole within %g s (api.request_timeout_s)", len(overdue), limit)
        if self._evicted:
            log.warning(
                "api: closed %d idle connection(s) to make room for new ones (at most %d are kept open)",
                self._evicted, CONNECTION_LIMIT,
            )
            self._evicted = 0

    def close(self, timeout: float) -> None:
        """Let the request threads finish their answers, flush them, close every connection, join."""
        server = self._server
        if server is None or self._thread is None:
            return
        # What is still waited for will not be finished (the frames in flight are done, or out
        # of time): every waiting request answers 503 now, rather than once its connection is gone.
        self.app.release()
        deadline = time.monotonic() + max(timeout, _HANDOVER_S)
        dispatcher = server.task_dispatcher
        # Requests still queued or running get their answer (503 now the daemon is stopping)
        # rather than a dropped connection: waitress cancels what is still queued at shutdown.
        while time.monotonic() < deadline and (dispatcher.queue or dispatcher.active_count):
            time.sleep(0.01)
        self._deaf.set()
        dispatcher.shutdown(cancel_pending=True, timeout=max(0.1, deadline - time.monotonic()))
        channels = server._map
        while time.monotonic() < deadline and any(getattr(c, "total_outbufs_len", 0) for c in list(channels.values())):
            time.sleep(0.01)
        self._closing.set()
        self._thread.join(max(0.5, deadline - time.monotonic()))
        self._server = None
