"""`depthwatch models fetch` against a real HTTP server on 127.0.0.1, started by each test.

The server serves tiny real ONNX models, answers Range requests (so resuming
is real), can cut a response short once (an interrupted download), fail with
a status, or redirect (GitHub release assets redirect). The CLI runs as a
real process where the exit code and the one-line message matter.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from onnx_models import brightness_model

from depthwatch.model import fetch
from depthwatch.model.catalogue import Entry

NAME = "midas-v21-small"
FILE = "model-small.onnx"


@dataclass
class Route:
    data: bytes = b""
    status: int = 200
    #: Send only this many body bytes, then close, for the next `cuts` requests.
    cut_after: int | None = None
    cuts: int = 0
    redirect: str | None = None
    ranges: bool = True


class ModelServer:
    """An http.server on a free port of 127.0.0.1, in a thread the test joins."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        #: (path, Range header) of every request, in order.
        self.requests: list[tuple[str, str | None]] = []
        self._server = HTTPServer(("127.0.0.1", 0), _Handler)
        self._server.model_server = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05})

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def __enter__(self) -> ModelServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        server: ModelServer = self.server.model_server  # type: ignore[attr-defined]
        asked = self.headers.get("Range")
        server.requests.append((self.path, asked))
        route = server.routes.get(self.path)
        if route is None:
            self.send_error(404)
            return
        if route.redirect:
            self.send_response(302)
            self.send_header("Location", route.redirect)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if route.status != 200:
            self.send_error(route.status)
            return
        data, start = route.data, 0
        match = re.fullmatch(r"bytes=(\d+)-", asked or "")
        if match and route.ranges:
            start = int(match.group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if route.cut_after is not None and route.cuts > 0:
            route.cuts -= 1
            self.wfile.write(body[: route.cut_after])
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
        pass


@pytest.fixture
def server():
    with ModelServer() as running:
        yield running


@pytest.fixture
def model_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return brightness_model(tmp_path_factory.mktemp("served") / "model.onnx").read_bytes()


@pytest.fixture
def other_model_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return brightness_model(tmp_path_factory.mktemp("served") / "other.onnx", scale=2.0).read_bytes()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("NO_PROXY", "*")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entry_for(url: str, *, sha: str | None = None, size: int | None = None) -> Entry:
    return Entry(name=NAME, file=FILE, url=url, profile="midas-v21-small", licence="MIT", sha256=sha, size=size)


def write_catalogue(path: Path, url: str, *, sha: str | None = None, approx_mb: float | None = None) -> Path:
    path.write_text(
        "models:\n"
        f"  {NAME}:\n"
        f"    file: {FILE}\n"
        f"    url: {url}\n"
        "    profile: midas-v21-small\n"
        "    licence: MIT\n"
        f"    sha256: {sha or 'null'}\n"
        f"    approx_mb: {approx_mb if approx_mb is not None else 'null'}\n",
        encoding="utf-8",
    )
    return path


def cli(tmp_path: Path, *args: str, catalogue: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`depthwatch ARGS` as its own process, with a home of its own and no proxies."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "DEPTHWATCH_"))}
    home = tmp_path / "home"
    env.update(HOME=str(home), XDG_DATA_HOME=str(home / "data"), XDG_CONFIG_HOME=str(home / "config"))
    env.update(no_proxy="*", NO_PROXY="*")
    if catalogue is not None:
        env["DEPTHWATCH_CATALOGUE"] = str(catalogue)
    return subprocess.run(
        [sys.executable, "-m", "depthwatch", *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False,
    )


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


# -- through the real CLI ------------------------------------------------------------------


def test_fetch_follows_the_redirect_shows_progress_and_records_the_sha256(server, model_bytes, tmp_path):
    server.routes["/asset"] = Route(model_bytes)
    server.routes["/release/model-small.onnx"] = Route(redirect=server.url("/asset"))
    catalogue = write_catalogue(tmp_path / "catalogue.yaml", server.url("/release/model-small.onnx"))
    folder = tmp_path / "models"

    done = cli(tmp_path, "models", "fetch", NAME, "--folder", str(folder), catalogue=catalogue)

    assert done.returncode == 0, done.stderr
    assert (folder / FILE).read_bytes() == model_bytes
    assert (folder / f"{FILE}.sha256").read_text() == f"{sha256(model_bytes)}  {FILE}\n"
    assert leftovers(folder) == [FILE, f"{FILE}.sha256"]
    assert done.stdout == f"{NAME}: saved {folder / FILE} ({len(model_bytes)} bytes, sha256 {sha256(model_bytes)})\n"
    assert f"{NAME}: 100%" in done.stderr  # tqdm's bar reached the end
    assert [path for path, _ in server.requests] == ["/release/model-small.onnx", "/asset"]

    listed = cli(tmp_path, "models", "list", "--folder", str(folder), catalogue=catalogue)
    assert listed.returncode == 0
    assert re.search(rf"^{NAME} \*\s+ok\s", listed.stdout, re.M), listed.stdout


def test_an_interrupted_fetch_resumes_where_it_stopped(server, model_bytes, tmp_path):
    half = len(model_bytes) // 2
    server.routes["/m.onnx"] = Route(model_bytes, cut_after=half, cuts=1)
    catalogue = write_catalogue(tmp_path / "catalogue.yaml", server.url("/m.onnx"))
    folder = tmp_path / "models"

    first = cli(tmp_path, "models", "fetch", NAME, "--folder", str(folder), catalogue=catalogue)

    assert first.returncode == 69
    assert last_line(first.stderr) == (
        f"depthwatch: the download of {NAME} stopped after {half} of {len(model_bytes)} bytes "
        "(the server closed the connection); run the same command again to resume"
    )
    assert not (folder / FILE).exists()
    assert (folder / f".{FILE}.part").read_bytes() == model_bytes[:half]

    second = cli(tmp_path, "models", "fetch", NAME, "--folder", str(folder), catalogue=catalogue)

    assert second.returncode == 0, second.stderr
    assert server.requests == [("/m.onnx", None), ("/m.onnx", f"bytes={half}-")]
    assert f"resumed at byte {half}" in second.stdout
    assert (folder / FILE).read_bytes() == model_bytes
    assert (folder / f"{FILE}.sha256").read_text().split()[0] == sha256(model_bytes)
    assert leftovers(folder) == [FILE, f"{FILE}.sha256"]


def test_a_checksum_mismatch_leaves_nothing_behind_and_the_old_model_untouched(
    server, model_bytes, other_model_bytes, tmp_path
):
    server.routes["/m.onnx"] = Route(other_model_bytes)
    catalogue = write_catalogue(tmp_path / "catalogue.yaml", server.url("/m.onnx"), sha=sha256(model_bytes))
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / FILE).write_bytes(model_bytes)

    done = cli(tmp_path, "models", "fetch", NAME, "--force", "--folder", str(folder), catalogue=catalogue)

    assert done.returncode == 65
    assert last_line(done.stderr) == (
        f"depthwatch: checksum mismatch for {NAME}: got sha256 {sha256(other_model_bytes)}, "
        f"not the catalogue's ({sha256(model_bytes)}); the download was discarded and {FILE} left as it was; "
        "the file on the server is not the one the catalogue names"
    )
    assert (folder / FILE).read_bytes() == model_bytes
    assert leftovers(folder) == [FILE]  # no part file, and no lock file for a checksummed entry


def test_a_server_error_is_one_line_and_exit_69(server, tmp_path):
    server.routes["/m.onnx"] = Route(status=500)
    url = server.url("/m.onnx")
    catalogue = write_catalogue(tmp_path / "catalogue.yaml", url)
    folder = tmp_path / "models"

    done = cli(tmp_path, "models", "fetch", NAME, "--folder", str(folder), catalogue=catalogue)

    assert done.returncode == 69
    assert last_line(done.stderr) == (
        f"depthwatch: cannot download {NAME} from {url}: the server answered HTTP 500 Internal Server Error; "
        f"try again later or put the file at {folder / FILE} yourself"
    )
    assert leftovers(folder) == []


def test_an_unreachable_host_is_one_line_and_exit_69(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/m.onnx"
    catalogue = write_catalogue(tmp_path / "catalogue.yaml", url)
    folder = tmp_path / "models"

    done = cli(tmp_path, "models", "fetch", NAME, "--folder", str(folder), catalogue=catalogue)

    assert done.returncode == 69
    assert last_line(done.stderr) == (
        f"depthwatch: cannot download {NAME} from {url}: connection refused; "
        f"check the internet connection or put the file at {folder / FILE} yourself"
    )
    assert leftovers(folder) == []


def test_fetch_uses_the_configs_model_folder(server, model_bytes, tmp_path):
    server.routes["/m.onnx"] = Route(model_bytes)
    catalogue = write_catalogue(tmp_path / "catalogue.yaml", server.url("/m.onnx"))
    config = tmp_path / "depthwatch.yaml"
    config.write_text("model:\n  folder: ./weights\n", encoding="utf-8")

    done = cli(tmp_path, "models", "fetch", NAME, "-c", str(config), "--no-progress", catalogue=catalogue)

    assert done.returncode == 0, done.stderr
    assert (tmp_path / "weights" / FILE).read_bytes() == model_bytes
    assert "%" not in done.stderr


# -- the download logic, in-process --------------------------------------------------------


def test_a_verified_copy_is_kept_without_asking_the_server(server, model_bytes, tmp_path):
    server.routes["/m.onnx"] = Route(model_bytes)
    entry = entry_for(server.url("/m.onnx"))
    first = fetch.fetch(entry, tmp_path)
    again = fetch.fetch(entry, tmp_path)

    assert (first.downloaded, again.downloaded) == (len(model_bytes), 0)
    assert len(server.requests) == 1
    assert fetch.state(entry, tmp_path) == "ok"


def test_a_damaged_copy_is_downloaded_again_and_checked_against_the_lock(server, model_bytes, tmp_path):
    server.routes["/m.onnx"] = Route(model_bytes)
    entry = entry_for(server.url("/m.onnx"))
    fetch.fetch(entry, tmp_path)
    (tmp_path / FILE).write_bytes(model_bytes[:100])
    assert fetch.state(entry, tmp_path) == "changed"

    fetch.fetch(entry, tmp_path)

    assert (tmp_path / FILE).read_bytes() == model_bytes
    assert fetch.state(entry, tmp_path) == "ok"


def test_a_changed_file_on_the_server_does_not_replace_a_locked_model(server, model_bytes, other_model_bytes, tmp_path):
    server.routes["/m.onnx"] = Route(model_bytes)
    entry = entry_for(server.url("/m.onnx"))
    fetch.fetch(entry, tmp_path)
    server.routes["/m.onnx"] = Route(other_model_bytes)

    with pytest.raises(fetch.IntegrityError, match=rf"recorded in .*{FILE}\.sha256 .*delete {FILE}\.sha256 to accept it"):
        fetch.fetch(entry, tmp_path, force=True)

    assert (tmp_path / FILE).read_bytes() == model_bytes
    assert leftovers(tmp_path) == [FILE, f"{FILE}.sha256"]


def test_a_file_that_is_not_an_onnx_model_is_discarded(server, tmp_path):
    server.routes["/m.onnx"] = Route(b"<html>not a model</html>" * 10)
    entry = entry_for(server.url("/m.onnx"))

    with pytest.raises(fetch.IntegrityError, match=r"is not a usable ONNX model \(cannot load model .*the download was discarded$") as caught:
        fetch.fetch(entry, tmp_path)

    assert caught.value.exit_code == 65
    assert leftovers(tmp_path) == []


def test_a_size_other_than_the_catalogues_is_refused(server, model_bytes, tmp_path):
    server.routes["/m.onnx"] = Route(model_bytes)
    entry = entry_for(server.url("/m.onnx"), size=len(model_bytes) + 1)

    with pytest.raises(fetch.IntegrityError, match=rf"is {len(model_bytes)} bytes, not the {len(model_bytes) + 1}"):
        fetch.fetch(entry, tmp_path)
    assert leftovers(tmp_path) == []


def test_a_hand_placed_model_is_adopted_and_its_sha256_recorded(server, model_bytes, tmp_path):
    entry = entry_for(server.url("/never-asked.onnx"))
    (tmp_path / FILE).write_bytes(model_bytes)
    assert fetch.state(entry, tmp_path) == "unverified"

    kept = fetch.fetch(entry, tmp_path)

    assert kept.downloaded == 0
    assert server.requests == []
    assert fetch.recorded_sha256(tmp_path / FILE) == sha256(model_bytes)


def test_a_server_that_ignores_range_makes_the_download_start_over(server, model_bytes, tmp_path):
    server.routes["/m.onnx"] = Route(model_bytes, ranges=False)
    (tmp_path / f".{FILE}.part").write_bytes(b"stale bytes from another file")

    got = fetch.fetch(entry_for(server.url("/m.onnx")), tmp_path)

    assert server.requests == [("/m.onnx", "bytes=29-")]
    assert (got.resumed_from, got.downloaded) == (0, len(model_bytes))
    assert (tmp_path / FILE).read_bytes() == model_bytes


def test_a_part_file_already_complete_is_checked_and_put_in_place(server, model_bytes, tmp_path):
    server.routes["/m.onnx"] = Route(model_bytes)
    (tmp_path / f".{FILE}.part").write_bytes(model_bytes)

    got = fetch.fetch(entry_for(server.url("/m.onnx"), sha=sha256(model_bytes)), tmp_path)

    assert server.requests == [("/m.onnx", f"bytes={len(model_bytes)}-")]  # answered 416: nothing left to send
    assert got.downloaded == 0
    assert (tmp_path / FILE).read_bytes() == model_bytes
    assert leftovers(tmp_path) == [FILE]


def test_a_silent_server_times_out(tmp_path):
    with socket.socket() as silent:  # accepts connections (the backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/m.onnx"

        with pytest.raises(fetch.DownloadError, match=r": the connection timed out; check the internet connection") as caught:
            fetch.fetch(entry_for(url), tmp_path, timeout=0.2)

    assert caught.value.exit_code == 69
    assert leftovers(tmp_path) == []


def test_a_second_fetch_of_the_same_model_waits_its_turn(server, model_bytes, tmp_path):
    server.routes["/m.onnx"] = Route(model_bytes)
    with open(tmp_path / f".{FILE}.part", "ab") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)

        with pytest.raises(fetch.BusyError, match=rf"another `depthwatch models fetch {NAME}` is downloading") as caught:
            fetch.fetch(entry_for(server.url("/m.onnx")), tmp_path)

    assert caught.value.exit_code == 75
    assert server.requests == []


def test_a_folder_that_cannot_be_created_is_exit_73(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")

    with pytest.raises(fetch.FolderError, match="cannot create the model folder") as caught:
        fetch.fetch(entry_for("http://127.0.0.1:9/m.onnx"), blocker / "models")

    assert caught.value.exit_code == 73


def test_an_offline_stand_in_far_from_the_catalogues_size_is_not_recorded_as_the_truth(model_bytes, tmp_path):
    """A tiny file put in place of a ~64 MB model: refused (65), nothing recorded, until --accept."""
    catalogue = write_catalogue(tmp_path / "catalogue.yaml", "http://127.0.0.1:9/unreachable.onnx", approx_mb=64)
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / FILE).write_bytes(model_bytes)

    refused = cli(tmp_path, "models", "fetch", NAME, "--folder", str(folder), catalogue=catalogue)
    listed = cli(tmp_path, "models", "list", "--folder", str(folder), catalogue=catalogue)

    assert refused.returncode == fetch.EX_DATAERR
    assert last_line(refused.stderr) == (
        f"depthwatch: {folder / FILE} is {len(model_bytes)} bytes, far from the ~64 MB of {NAME}, so it is probably "
        f"another model; nothing was recorded. Delete it and fetch {NAME} online, or if it is the right file, "
        f"`depthwatch models fetch {NAME} --accept`"
    )
    assert leftovers(folder) == [FILE]  # no .sha256 recorded, the file left as it was
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith(NAME))
    assert re.match(rf"{NAME} \*\s+unverified\s+{re.escape(FILE)}\s+{len(model_bytes)} bytes\s+256 px", row), row
    assert f"{NAME}: {FILE} is {len(model_bytes)} bytes, far from the ~64 MB of {NAME}; it is probably another model" in listed.stdout

    accepted = cli(tmp_path, "models", "fetch", NAME, "--folder", str(folder), "--accept", catalogue=catalogue)

    assert accepted.returncode == 0, accepted.stderr
    assert fetch.recorded_sha256(folder / FILE) == sha256(model_bytes)


def test_a_hand_placed_copy_near_the_catalogues_size_is_adopted(model_bytes, tmp_path):
    entry = Entry(name=NAME, file=FILE, url="http://127.0.0.1:9/m.onnx", profile="midas-v21-small", licence="MIT",
                  approx_mb=len(model_bytes) * 1.5 / (1 << 20))
    (tmp_path / FILE).write_bytes(model_bytes)

    kept = fetch.fetch(entry, tmp_path)

    assert kept.downloaded == 0 and fetch.recorded_sha256(tmp_path / FILE) == sha256(model_bytes)


def test_a_wrong_file_placed_by_hand_offline_is_refused_with_what_to_do_and_accept_keeps_it(
    server, model_bytes, other_model_bytes, tmp_path
):
    """midas-v21-small's place holds another model and the network is out: exit 65 and what to do with
    the file that is there (not "downloading it again", then "put the file at ... yourself", exit 69,
    with or without --accept). --accept keeps it and records its sha256; --force online replaces it."""
    with socket.socket() as probe:  # a port nothing listens on: offline
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    offline = write_catalogue(tmp_path / "offline.yaml", f"http://127.0.0.1:{port}/m.onnx", sha=sha256(model_bytes))
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / FILE).write_bytes(other_model_bytes)

    refused = cli(tmp_path, "models", "fetch", NAME, "--folder", str(folder), catalogue=offline)

    assert refused.returncode == fetch.EX_DATAERR, refused.stderr
    assert last_line(refused.stderr) == (
        f"depthwatch: {folder / FILE} does not match the sha256 of {NAME} (the catalogue's): another model, or a "
        f"damaged copy, and no copy to replace it could be downloaded (connection refused); remove it and fetch "
        f"{NAME} again online, or keep it with `depthwatch models fetch {NAME} --accept`"
    )
    assert (folder / FILE).read_bytes() == other_model_bytes
    assert leftovers(folder) == [FILE]

    accepted = cli(tmp_path, "models", "fetch", NAME, "--folder", str(folder), "--accept", catalogue=offline)

    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout == (
        f"{NAME}: kept {folder / FILE} as it is ({len(other_model_bytes)} bytes, sha256 {sha256(other_model_bytes)}, "
        f"recorded in {FILE}.sha256); `depthwatch models fetch {NAME} --force` downloads the catalogue's copy instead\n"
    )
    assert fetch.recorded_sha256(folder / FILE) == sha256(other_model_bytes)
    again = cli(tmp_path, "models", "fetch", NAME, "--folder", str(folder), catalogue=offline)
    assert again.returncode == 0, again.stderr  # the accepted file is taken for the model, offline too
    listed = cli(tmp_path, "models", "list", "--folder", str(folder), catalogue=offline)
    assert re.search(rf"^{NAME} \*\s+accepted\s", listed.stdout, re.M), listed.stdout

    server.routes["/m.onnx"] = Route(model_bytes)
    online = write_catalogue(tmp_path / "online.yaml", server.url("/m.onnx"), sha=sha256(model_bytes))
    replaced = cli(tmp_path, "models", "fetch", NAME, "--folder", str(folder), "--force", catalogue=online)

    assert replaced.returncode == 0, replaced.stderr
    assert (folder / FILE).read_bytes() == model_bytes
    assert leftovers(folder) == [FILE]  # the accepted file's record goes with it
