"""The HTTP API on the real daemon process, driven as the classic plugins drive it (requests)."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import jpeg_bytes, write_by_rename
from daemon_process import DaemonProcess, assert_one_process, machine_factor, strace_works, wait_for

requests = pytest.importorskip("requests")
pytest.importorskip("waitress")

from depthwatch.imaging import codec, normalise, render, tensor  # noqa: E402
from depthwatch.config import ApiConfig, Config, OutputConfig, WatchConfig  # noqa: E402
from depthwatch.daemon.waiters import DONE, TIMEOUT, MapWaiters  # noqa: E402
from depthwatch.frames import provenance  # noqa: E402
from depthwatch.frames.job import Job  # noqa: E402
from depthwatch.frames.result import Result  # noqa: E402
from depthwatch.frames.settings import Settings  # noqa: E402
from depthwatch.frames.rules import Rules  # noqa: E402
from depthwatch.model.engine import Engine  # noqa: E402
from depthwatch.model.profiles import PROFILES  # noqa: E402
from depthwatch.model.spec import ModelSpec  # noqa: E402

HTTP_TIMEOUT = 60


def block_frame(seed: int, width: int = 96, height: int = 64) -> np.ndarray:
    """A frame of random gray blocks: every seed gives a clearly different depth map."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (4, 6), dtype=np.uint8)
    gray = cv2.resize(blocks, (width, height), interpolation=cv2.INTER_NEAREST)
    return cv2.cvtColor(gray, cv2.COLOR_GRAY2BGR)


class Reference:
    """The model run directly (its own engine, no daemon): the map a frame must get."""

    def __init__(self, model: Path) -> None:
        self.engine = Engine(ModelSpec(model, PROFILES["midas-v21-small"], providers=("cpu",))).start()
        self.info = self.engine.wait_ready()

    def depth(self, data: bytes, bits: int = 8) -> np.ndarray:
        """The map with the daemon's default output settings (refine, levels) at `bits`."""
        decoded = codec.decode(data, max_pixels=10**8, min_size=self.info.min_frame_size)
        prepared = tensor.prepare(decoded, self.info.contract, self.info.profile)
        prediction = self.engine.infer(prepared, self.info.generation).result(HTTP_TIMEOUT).prediction
        options = dataclasses.replace(Settings.from_config(Config()).render, bits=bits)
        nearness = normalise.frame(prediction, self.info.profile.predicts, options.clip_percent)
        return render.render(nearness, decoded.size, options, guide=decoded.image)

    def close(self) -> None:
        self.engine.stop()


@pytest.fixture
def reference(tiny_model):
    ref = Reference(tiny_model)
    yield ref
    ref.close()


def assert_same_map(got: np.ndarray, want: np.ndarray, others: list[np.ndarray] = ()) -> None:
    """Within JPEG's error of `want`, and much farther from every other frame's map."""
    assert got.shape == want.shape
    error = np.abs(got.astype(np.float64) - want.astype(np.float64)).mean()
    top = 65535 if want.dtype == np.uint16 else 255
    assert error < 0.02 * top, f"mean error {error:.1f}"
    for other in others:
        assert np.abs(got.astype(np.float64) - other.astype(np.float64)).mean() > 3 * error + 0.02 * top


def decode_map(data: bytes) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    assert image is not None, "not an image"
    return image


def api_lines(d: DaemonProcess) -> list[str]:
    return [line for line in d.log().splitlines() if " api: " in line or line.startswith("api: ")]


# -- the classic plugin's protocol ------------------------------------------------------------


def test_classic_client_two_hundred_rounds_one_inference_each(api_daemon, reference):
    """Write tmp/frame.jpg, POST /predict, read tmp/depth.jpg: its map, every time, never run twice."""
    d = api_daemon()
    rounds = 200
    previous: np.ndarray | None = None
    with requests.Session() as http:
        for i in range(rounds):
            data = jpeg_bytes(block_frame(i))
            if i % 2:
                write_by_rename(d.watch / "frame.jpg", data)  # a careful plugin
            else:
                (d.watch / "frame.jpg").write_bytes(data)  # cv2.imwrite, as the classic plugin does
            answer = http.post(f"{d.url}/predict", timeout=HTTP_TIMEOUT)
            assert (answer.status_code, answer.text) == (200, "DONE"), answer.text
            got = decode_map((d.watch / "depth.jpg").read_bytes())
            want = reference.depth(data)
            assert_same_map(got, want, [previous] if previous is not None else [])
            previous = want
    try:
        wait_for(lambda: d.counts().get("done") == rounds, what=f"done == {rounds}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; counts {d.counts()}; log tail {d.log()[-3000:]}") from None
    assert d.stop() == 0
    assert d.counts()["done"] == rounds, d.counts()
    assert len(d.frame_lines()) == rounds, "a frame was run twice"
    assert d.counts()["failed"] == 0


def test_the_watcher_finding_a_requested_version_later_does_not_run_it_again(api_daemon):
    """Polling with a long settle: the request always comes first, the watcher finds that version later."""
    d = api_daemon(watch={"observer": "polling", "poll_interval_ms": 50, "settle_ms": 1000}, daemon={"log_level": "debug"})
    absorbed = lambda: d.log().count("the watcher found the version a request already queued")  # noqa: E731
    rounds = 5
    for i in range(rounds):
        (d.watch / "frame.jpg").write_bytes(jpeg_bytes(block_frame(300 + i)))
        answer = requests.post(f"{d.url}/predict", timeout=HTTP_TIMEOUT)
        assert (answer.status_code, answer.text) == (200, "DONE")
        wait_for(lambda: absorbed() == i + 1, what="the watcher to find the requested version")
    assert d.stop() == 0
    assert len(d.frame_lines()) == rounds, d.log()
    assert d.counts()["done"] == rounds


def test_a_finished_frame_is_answered_without_running_it_again(api_daemon):
    d = api_daemon()
    write_by_rename(d.watch / "frame.jpg", jpeg_bytes(block_frame(1)))
    wait_for(lambda: d.counts().get("done") == 1, what="the watcher's map")
    for _ in range(3):
        answer = requests.post(f"{d.url}/predict", timeout=HTTP_TIMEOUT)
        assert (answer.status_code, answer.text) == (200, "DONE")
    assert d.stop() == 0
    assert len(d.frame_lines()) == 1, d.log()


def test_the_classic_frame_is_the_pattern_as_written(api_daemon):
    """`patterns: [Frame.JPG]` on a case-sensitive disk: the frame is Frame.JPG, not frame.jpg."""
    d = api_daemon(watch={"patterns": ["Frame.JPG"]}, output={"template": "depth.jpg"})
    write_by_rename(d.watch / "Frame.JPG", jpeg_bytes(block_frame(3)))
    answer = requests.post(f"{d.url}/predict", timeout=HTTP_TIMEOUT)
    assert (answer.status_code, answer.text) == (200, "DONE")
    assert (d.watch / "depth.jpg").is_file()
    assert d.stop() == 0


def test_frame_parameter_names_another_frame(api_daemon, reference):
    d = api_daemon(watch={"patterns": ["frame.jpg", "shot_*.jpg"]}, output={"template": "{stem}_depth.jpg"})
    data = jpeg_bytes(block_frame(7))
    write_by_rename(d.watch / "shot_7.jpg", data)
    answer = requests.post(f"{d.url}/predict", params={"frame": "shot_7.jpg"}, timeout=HTTP_TIMEOUT)
    assert (answer.status_code, answer.text) == (200, "DONE")
    assert_same_map(decode_map((d.watch / "shot_7_depth.jpg").read_bytes()), reference.depth(data))
    assert d.stop() == 0
    assert len(d.frame_lines()) == 1


def test_eight_clients_posting_images_each_get_their_own_map(api_daemon, reference):
    d = api_daemon()
    images = [jpeg_bytes(block_frame(100 + i, 128, 80)) for i in range(8)]
    wants = [reference.depth(data) for data in images]
    png_image = cv2.imencode(".png", block_frame(200, 128, 80))[1].tobytes()
    want16 = reference.depth(png_image, bits=16)
    barrier = threading.Barrier(8)

    def client(i: int) -> list[tuple[str, bytes, str]]:
        barrier.wait(HTTP_TIMEOUT)
        got = []
        with requests.Session() as http:
            for _ in range(3):
                answer = http.post(
                    f"{d.url}/predict", data=images[i], headers={"Content-Type": "image/jpeg"}, timeout=HTTP_TIMEOUT
                )
                assert answer.status_code == 200, answer.text
                got.append((answer.headers["Content-Type"], answer.content, answer.headers["X-Depthwatch-Size"]))
        return got

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(client, range(8)))
    for i, answers in enumerate(results):
        for content_type, body, size in answers:
            assert (content_type, size) == ("image/jpeg", "128x80")
            assert_same_map(decode_map(body), wants[i], [w for j, w in enumerate(wants) if j != i])

    by_accept = requests.post(
        f"{d.url}/predict", data=png_image, headers={"Content-Type": "image/png", "Accept": "image/png"}, timeout=HTTP_TIMEOUT
    )
    assert by_accept.headers["Content-Type"] == "image/png"
    got16 = decode_map(by_accept.content)
    assert got16.dtype == np.uint16  # output.png_bits, 16 by default
    assert_same_map(got16, want16)
    by_format = requests.post(
        f"{d.url}/predict?format=png8", data=png_image, headers={"Content-Type": "image/png"}, timeout=HTTP_TIMEOUT
    )
    assert decode_map(by_format.content).dtype == np.uint8

    assert sorted(p.name for p in d.watch.iterdir()) == [], "an image body must write nothing"
    assert d.stop() == 0
    assert d.counts()["done"] == 0


# -- bad requests --------------------------------------------------------------------------------


def test_bad_requests_get_their_codes_and_one_log_line_each(api_daemon, tmp_path, reference):
    d = api_daemon(api={"max_body_mb": 0.05})
    (d.root / "secret.jpg").write_bytes(jpeg_bytes(block_frame(3)))
    os.symlink(d.root / "secret.jpg", d.watch / "link.jpg")
    post = lambda path="/predict", **kw: requests.post(f"{d.url}{path}", timeout=HTTP_TIMEOUT, **kw)  # noqa: E731
    cases = [
        ("no frame written yet", lambda: post(), 404),
        ("garbage body", lambda: post(data=b"\xff\xd8\xff" + b"garbage" * 100, headers={"Content-Type": "image/jpeg"}), 422),
        ("not an image", lambda: post(data=b"hello", headers={"Content-Type": "text/plain"}), 415),
        ("huge body", lambda: post(data=b"\xff" * 200_000, headers={"Content-Type": "image/jpeg"}), 413),
        ("escape with ..", lambda: post(params={"frame": "../secret.jpg"}), 403),
        ("absolute path outside", lambda: post(params={"frame": str(d.root / "secret.jpg")}), 403),
        ("symlink leading out", lambda: post(params={"frame": "link.jpg"}), 403),
        ("an output, not a frame", lambda: post(params={"frame": "depth.jpg"}), 403),
        ("no such endpoint", lambda: post("/nothing"), 404),
        ("unknown format", lambda: post(params={"format": "gif"}, data=b"x", headers={"Content-Type": "image/png"}), 400),
        ("an image body sent empty", lambda: post(data=b"", headers={"Content-Type": "image/jpeg"}), 422),
        ("the watch folder itself", lambda: post(params={"frame": "."}), 403),
        ("a name with a backslash, outside", lambda: post(params={"frame": "../a\\b.jpg"}), 403),
    ]
    for n, (what, send, code) in enumerate(cases, 1):
        answer = send()
        assert answer.status_code == code, f"{what}: {answer.status_code} {answer.text}"
        lines = api_lines(d)
        wait_for(lambda: len(api_lines(d)) == n, what=f"the log line for {what}")
        assert f": {code} " in api_lines(d)[-1], f"{what}: {api_lines(d)[-1]}"
        assert len(lines) <= n
    assert "secret" not in "".join(p.name for p in d.watch.iterdir() if p.name != "link.jpg")
    assert "the image/jpeg body is empty" in api_lines(d)[-3] and "frame=. is a watch folder, not a frame in one" in api_lines(d)[-2]
    # Escaped once, as the log escapes names (twice, `a\\\\b`, would match neither the name nor the log).
    assert "frame=../a\\\\b.jpg is outside the watch folders" in api_lines(d)[-1], api_lines(d)[-1]

    # An undecodable frame on disk: 422 (once the watcher has failed it too, still one attempt).
    write_by_rename(d.watch / "frame.jpg", b"\xff\xd8\xff" + b"\x00" * 64 + b"\xff\xd9")
    wait_for(lambda: d.counts().get("failed") == 1, what="the watcher to fail the frame")
    before = d.log().count("damaged or cut short")
    answer = post()
    assert answer.status_code == 422, answer.text
    wait_for(lambda: d.log().count("damaged or cut short") > before, what="the 422 line")
    assert d.log().count("damaged or cut short") == before + 1, "the failed version was run again"
    data = jpeg_bytes(block_frame(5))
    write_by_rename(d.watch / "frame.jpg", data)
    answer = post()
    assert (answer.status_code, answer.text) == (200, "DONE")
    assert_same_map(decode_map((d.watch / "depth.jpg").read_bytes()), reference.depth(data))
    assert requests.get(f"{d.url}/health", timeout=HTTP_TIMEOUT).status_code == 200
    assert d.stop() == 0


def test_a_request_waitress_cannot_parse_gets_its_400_and_its_connection_closed(api_daemon):
    """A garbage request line, a lowercase method, a header without a colon, a NUL in a header: each
    one 400, one log line, the connection closed. (A refusal's log line that reads the command and path
    such a request never had raises: no answer, a traceback, the connection held open, and a hundred
    of them lock every plugin out.) Also: HEAD /health is its headers alone, so a client's
    next answer on the connection is not read from a body it never asked for, and a name with a newline
    in it comes back on one line, as the log has it."""
    import socket

    d = api_daemon()
    host, port = d.url.removeprefix("http://").rsplit(":", 1)

    def exchange(request: bytes) -> bytes:
        with socket.create_connection((host, int(port)), timeout=HTTP_TIMEOUT) as s:
            s.sendall(request)
            data = b""
            while chunk := s.recv(65536):  # until the server closes: a hang fails on the timeout
                data += chunk
        return data

    for request in (b"GARBAGE\r\n\r\n", b"post /predict HTTP/1.1\r\nHost: x\r\n\r\n",
                    b"GET /health HTTP/1.1\r\nno colon here\r\n\r\n", b"GET /health HTTP/1.1\r\nX-A: a\x00b\r\n\r\n"):
        head, _, body = exchange(request).partition(b"\r\n\r\n")
        assert head.split(b" ")[1] == b"400" and body.count(b"\n") == 1, (request, head, body)
    wait_for(lambda: len(api_lines(d)) == 4, what="a log line for each")
    assert all(": 400 " in line for line in api_lines(d)) and "Traceback" not in d.log()

    both = exchange(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\nGET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    head, _, rest = both.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"Content-Length: " in head
    assert rest.startswith(b"HTTP/1.1 404 "), rest[:80]

    answer = requests.post(f"{d.url}/predict", params={"frame": "a\n\x1b[31mb.jpg"}, timeout=HTTP_TIMEOUT)
    assert answer.status_code == 403  # no frame of watch.patterns
    assert answer.text.count("\n") == 1 and "\x1b" not in answer.text and "a\\n\\x1b[31mb.jpg" in answer.text, answer.text
    assert requests.get(f"{d.url}/health", timeout=HTTP_TIMEOUT).status_code == 200
    assert d.stop() == 0


def test_token_is_required_when_set(api_daemon):
    d = api_daemon(api={"token": "s3cret-token"})
    write_by_rename(d.watch / "frame.jpg", jpeg_bytes(block_frame(9)))
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret-token"}):
        answer = requests.post(f"{d.url}/predict", headers=headers, timeout=HTTP_TIMEOUT)
        assert answer.status_code == 401, headers
        assert requests.get(f"{d.url}/health", headers=headers, timeout=HTTP_TIMEOUT).status_code == 401
    wait_for(lambda: len(api_lines(d)) == 6, what="one log line per refused request")
    assert all(": 401 " in line for line in api_lines(d))
    good = {"Authorization": "Bearer s3cret-token"}
    answer = requests.post(f"{d.url}/predict", headers=good, timeout=HTTP_TIMEOUT)
    assert (answer.status_code, answer.text) == (200, "DONE")
    assert d.stop() == 0


def test_no_map_in_time_is_504_and_a_stop_answers_the_waiting_request(api_daemon):
    """The output folder is read-only, so the map is retried (first after 1 s) and never lands."""
    d = api_daemon(restricted=True, api={"timeout_s": 0.5}, output={"template": "ro/depth.jpg"})
    ro = d.watch / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        (d.watch / "frame.jpg").write_bytes(jpeg_bytes(block_frame(11)))
        answer = requests.post(f"{d.url}/predict", timeout=HTTP_TIMEOUT)
        assert answer.status_code == 504, answer.text
        wait_for(lambda: any(": 504 " in line for line in api_lines(d)), what="the 504 log line")
    finally:
        ro.chmod(0o755)
    assert d.stop() == 0


def test_stop_answers_a_waiting_request_with_503(api_daemon):
    d = api_daemon(restricted=True, output={"template": "ro/depth.jpg"})
    ro = d.watch / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        (d.watch / "frame.jpg").write_bytes(jpeg_bytes(block_frame(12)))
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(requests.post, f"{d.url}/predict", timeout=HTTP_TIMEOUT)
            wait_for(lambda: d.counts().get("retried", 0) >= 1, what="the first retry")
            d.send(signal.SIGTERM)
            answer = pending.result(HTTP_TIMEOUT)
        assert answer.status_code == 503, answer.text
        assert d.proc.wait(HTTP_TIMEOUT) == 0
    finally:
        ro.chmod(0o755)
    assert "threads still running" not in d.log()


def test_health_is_the_status_json(api_daemon):
    d = api_daemon()
    answer = requests.get(f"{d.url}/health", timeout=HTTP_TIMEOUT)
    assert answer.status_code == 200
    body = answer.json()
    assert body["state"] == "running" and body["pid"] == d.proc.pid and body["api"] == d.url
    assert body["model"].endswith("tiny.onnx") and body["providers"] == ["CPUExecutionProvider"]
    assert d.stop() == 0


# -- where it listens, and that it never forks -------------------------------------------------------


def test_listens_on_loopback_only_by_default(api_daemon, tmp_path, tiny_model):
    psutil = pytest.importorskip("psutil")
    d = api_daemon()
    listening = [c for c in psutil.Process(d.proc.pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert listening and all(c.laddr.ip in ("127.0.0.1", "::1") for c in listening), listening
    assert d.url.startswith("http://127.0.0.1:")
    port = int(d.url.rsplit(":", 1)[1])
    taken = DaemonProcess(tmp_path / "taken", tiny_model, api={"enabled": True, "port": port})
    taken.start(wait=False)
    assert taken.proc.wait(HTTP_TIMEOUT) == 78
    assert "change api.port" in taken.log()
    taken.close()
    assert d.stop() == 0

    exposed = DaemonProcess(tmp_path / "exposed", tiny_model, api={"enabled": True, "host": "0.0.0.0", "port": 0})
    exposed.start(wait=False)
    assert exposed.proc.wait(HTTP_TIMEOUT) == 78
    assert "api.token is not set" in exposed.log()
    exposed.close()

    # A host that does not resolve (left to waitress, a bare ValueError: a traceback and exit 1, restarted
    # in a loop), or an address that is not this machine's (not a port to change): one line naming
    # api.host, exit 78, from `run` and from `check` alike; the status does not stay `starting`.
    for host, said in (("nosuchhost.invalid", "is neither an address nor a name this machine can resolve"),
                       ("192.0.2.1", "is not an address of this machine")):
        wrong = DaemonProcess(tmp_path / host, tiny_model, api={"enabled": True, "host": host, "token": "t", "port": 0})
        wrong.start(wait=False)
        assert wrong.proc.wait(HTTP_TIMEOUT) == 78
        wrong.close()
        assert f"depthwatch: api.host '{host}' {said}" in wrong.log() and "Traceback" not in wrong.log()
        assert wrong.state() == "stopped"
        check = subprocess.run([sys.executable, "-m", "depthwatch", "check", "-c", str(wrong.config_path)],
                               capture_output=True, text=True, timeout=HTTP_TIMEOUT * 4)
        lines = check.stderr.strip().splitlines()
        assert check.returncode == 78 and len(lines) == 1 and lines[0].startswith(f"depthwatch: api.host '{host}' {said}"), check.stderr


def test_run_api_flag(tmp_path, tiny_model):
    d = DaemonProcess(tmp_path, tiny_model)
    log = open(d.log_path, "ab")
    proc = subprocess.Popen(
        [os.sys.executable, "-m", "depthwatch", "run", "-c", str(d.config_path), "--api", "127.0.0.1:0"],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    try:
        url = wait_for(lambda: d.status().get("api"), what="the API address")
        assert requests.get(f"{url}/health", timeout=HTTP_TIMEOUT).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(HTTP_TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    refused = subprocess.run(
        [os.sys.executable, "-m", "depthwatch", "run", "-c", str(d.config_path), "--api", "0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=HTTP_TIMEOUT,
    )
    assert refused.returncode == 78 and "set api.token" in refused.stderr


def test_no_process_is_ever_created(api_daemon, tmp_path):
    if (why := strace_works()) is not None:
        pytest.skip(why)
    strace = shutil.which("strace")
    trace = tmp_path / "strace.txt"
    d = api_daemon(wrapper=(strace, "-f", "-e", "trace=fork,vfork,clone,clone3,execve", "-o", str(trace)))
    daemon_pid = d.status()["pid"]
    with requests.Session() as http:
        for i in range(5):
            write_by_rename(d.watch / "frame.jpg", jpeg_bytes(block_frame(i)))
            assert http.post(f"{d.url}/predict", timeout=HTTP_TIMEOUT).text == "DONE"
            body = jpeg_bytes(block_frame(50 + i))
            assert http.post(f"{d.url}/predict", data=body, headers={"Content-Type": "image/jpeg"}, timeout=HTTP_TIMEOUT).ok
        assert http.get(f"{d.url}/health", timeout=HTTP_TIMEOUT).ok
    os.kill(daemon_pid, signal.SIGTERM)
    assert d.proc.wait(HTTP_TIMEOUT) == 0
    assert_one_process(trace)


# -- the waiters, in-process: a superseded version still releases its request -----------------------


def _result(job: Job, ok: bool = True, superseded: bool = False) -> Result:
    if superseded:
        return Result(job, error="a newer version arrived", superseded=True)
    return Result(job) if ok else Result(job, error="cannot decode")


def test_a_superseded_version_is_released_by_the_newer_map(tmp_path):
    waiters = MapWaiters()
    source, output = tmp_path / "frame.jpg", tmp_path / "depth.jpg"
    older = Job(source, output, signature=(10, 1, 1))
    queued: list[Job] = []
    ticket = waiters.attach(older, lambda job: queued.append(job) or True)
    assert queued == [older]
    waiters.finished(older, _result(older, superseded=True))
    assert ticket.wait(0) .kind == TIMEOUT  # superseded: still waiting
    newer = Job(source, output, signature=(12, 2, 1))  # made after the request came
    waiters.finished(newer, _result(newer))
    assert ticket.wait(0).kind == DONE
    # The very version already written, its map on disk: answered at once, nothing queued.
    output.write_bytes(provenance.embed(jpeg_bytes(block_frame(0)), {"source": "frame.jpg", "size": 12, "mtime_ns": 2, "inode": 1}))
    again = waiters.attach(newer, lambda job: queued.append(job) or True)
    assert again.wait(0).kind == DONE and queued == [older]
    # A request's own version taken first: the watcher's event for it is dropped once.
    assert waiters.absorb(source, (10, 1, 1)) and not waiters.absorb(source, (10, 1, 1))
    # Its map deleted since: not DONE from memory, but queued again.
    output.unlink()
    gone = waiters.attach(newer, lambda job: queued.append(job) or True)
    assert gone.wait(0).kind == TIMEOUT and queued == [older, newer]


def test_an_older_versions_map_does_not_release_a_request(tmp_path):
    waiters = MapWaiters()
    source, output = tmp_path / "frame.jpg", tmp_path / "depth.jpg"
    stale = Job(source, output, signature=(10, 1, 1))  # made before the request
    wanted = Job(source, output, signature=(11, 2, 1))
    ticket = waiters.attach(wanted, lambda job: True)
    waiters.finished(stale, _result(stale))
    assert ticket.wait(0).kind == TIMEOUT
    waiters.finished(wanted, _result(wanted))
    assert ticket.wait(0).kind == DONE


def test_rules_refuse_escapes_used_by_the_api(tmp_path):
    from depthwatch.daemon.api import PredictApp, Refused

    watch = tmp_path / "watch"
    watch.mkdir()
    rules = Rules(WatchConfig(folders=(watch,), patterns=("frame.jpg", "*.png")), OutputConfig())
    app = PredictApp(None, ApiConfig())  # type: ignore[arg-type]
    assert app._resolve("frame.jpg", rules) == watch / "frame.jpg"
    for name in ("../x.png", "/etc/passwd", "sub/../../x.png", "", "a\x00.png", "depth.jpg"):
        with pytest.raises(Refused) as refused:
            app._resolve(name, rules)
        assert refused.value.status == 403, name


def test_a_refused_frame_is_told_its_own_reason(tmp_path):
    """A hidden frame is not "does not match watch.patterns" (it matches), and a user's photo named
    as maps are named, with no record of depthwatch's, is not "one of depthwatch's own files"."""
    from depthwatch.daemon.api import PredictApp, Refused

    watch = tmp_path / "watch"
    watch.mkdir()
    (watch / "photo_depth.png").write_bytes(b"a user's picture")
    rules = Rules(WatchConfig(folders=(watch,), patterns=("*.jpg", "*.png")), OutputConfig(template="{stem}_depth.png"))
    app = PredictApp(None, ApiConfig())  # type: ignore[arg-type]
    reasons = {}
    for name in (".x.jpg", "photo_depth.png", "notes.txt"):
        with pytest.raises(Refused) as refused:
            app._resolve(name, rules)
        reasons[name] = str(refused.value)
    assert ".x.jpg is a hidden file (its name starts with a dot)" in reasons[".x.jpg"]
    assert "photo_depth.png is named as output.template names depth maps ({stem}_depth.png)" in reasons["photo_depth.png"]
    assert "notes.txt does not match watch.patterns (*.jpg, *.png)" in reasons["notes.txt"]


# -- slow clients, reload, the extra ------------------------------------------------------------------


def test_a_stuck_client_blocks_neither_the_watcher_nor_other_requests(api_daemon, reference):
    import socket

    d = api_daemon()
    host, port = d.url.removeprefix("http://").rsplit(":", 1)
    stuck = []
    for _ in range(20):  # more than the request threads: each sent half a request and stopped
        s = socket.create_connection((host, int(port)), timeout=HTTP_TIMEOUT)
        s.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\nContent-Length: 100000\r\n\r\n\xff\xd8")
        stuck.append(s)
    try:
        write_by_rename(d.watch / "frame.jpg", jpeg_bytes(block_frame(21)))
        wait_for(lambda: d.counts().get("done") == 1, what="the watcher's map while clients are stuck")
        data = jpeg_bytes(block_frame(22))
        write_by_rename(d.watch / "frame.jpg", data)
        answer = requests.post(f"{d.url}/predict", timeout=HTTP_TIMEOUT)
        assert (answer.status_code, answer.text) == (200, "DONE")
        assert_same_map(decode_map((d.watch / "depth.jpg").read_bytes()), reference.depth(data))
    finally:
        for s in stuck:
            s.close()
    assert d.stop() == 0


def test_api_settings_take_effect_at_the_next_start(api_daemon):
    import yaml

    d = api_daemon()
    config = yaml.safe_load(d.config_path.read_text())
    config["api"]["timeout_s"] = 5
    d.config_path.write_text(yaml.safe_dump(config))
    wait_for(lambda: d.status().get("config_loads") == 2, what="the reload")
    assert "the api settings take effect at the next start" in d.log()
    assert requests.get(f"{d.url}/health", timeout=HTTP_TIMEOUT).status_code == 200
    assert d.stop() == 0


def test_the_daemon_needs_waitress_only_with_the_api_on(tmp_path, tiny_model):
    """Without the api extra: the daemon runs; turning the API on is a one-line config error."""
    blocker = tmp_path / "no_waitress"
    blocker.mkdir()
    (blocker / "waitress.py").write_text("raise ImportError('blocked for this test', name='waitress')\n")
    env = {**os.environ, "PYTHONPATH": str(blocker)}
    plain = DaemonProcess(tmp_path / "plain", tiny_model)
    probe = subprocess.run(
        [os.sys.executable, "-c", "import sys, depthwatch.daemon.lifecycle, depthwatch.commands.run; assert 'waitress' not in sys.modules"],
        env=env,
        capture_output=True,
        text=True,
        timeout=HTTP_TIMEOUT,
    )
    assert probe.returncode == 0, probe.stderr
    refused = subprocess.run(
        [os.sys.executable, "-m", "depthwatch", "run", "-c", str(plain.config_path), "--api", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=HTTP_TIMEOUT,
    )
    assert refused.returncode == 78, refused.stderr
    assert "pip install 'depthwatch[api]'" in refused.stderr


def test_the_waitress_internals_the_shutdown_drives_are_where_it_expects():
    """Waitress has no public way to stop a server from another thread (its maintainers:
    Pylons/waitress#343, #372), so ApiServer runs waitress's own loop one poll at a time and
    closes the listener and the connections between polls. The version is pinned to the series
    this was written against; this test names what moved when the pin is raised."""
    import inspect

    from waitress import wasyncore
    from waitress.channel import HTTPChannel
    from waitress.server import BaseWSGIServer, create_server
    from waitress.task import ThreadedTaskDispatcher

    assert {"timeout", "use_poll", "map", "count"} <= set(inspect.signature(wasyncore.loop).parameters)
    assert {"map", "ignore_all"} <= set(inspect.signature(wasyncore.close_all).parameters)
    assert {"cancel_pending", "timeout"} <= set(inspect.signature(ThreadedTaskDispatcher.shutdown).parameters)
    assert isinstance(HTTPChannel.total_outbufs_len, int)
    # Making room at the connection limit and the request deadline read a channel's request state.
    assert HTTPChannel.request is None and HTTPChannel.will_close is False
    assert callable(HTTPChannel.received) and callable(HTTPChannel.handle_close)
    dispatcher = ThreadedTaskDispatcher()
    assert len(dispatcher.queue) == 0 and dispatcher.active_count == 0  # close() waits for both to drain
    assert issubclass(BaseWSGIServer, wasyncore.dispatcher)
    server = create_server(lambda environ, start: [], host="127.0.0.1", port=0, threads=1)
    try:
        assert isinstance(server, BaseWSGIServer)
        assert server in server._map.values(), "the listener is no longer in the server's channel map"
        assert isinstance(server.adj.asyncore_use_poll, bool)
        wasyncore.dispatcher.close(server)  # the listener only: the trigger stays in the map
        assert server not in server._map.values() and server._map, "closing the listener left no trigger"
        wasyncore.loop(timeout=0.01, use_poll=server.adj.asyncore_use_poll, map=server._map, count=1)
    finally:
        server.task_dispatcher.shutdown(cancel_pending=True, timeout=1)
        wasyncore.close_all(server._map, ignore_all=True)
    assert not server._map


# -- work nobody waits for, the bound on waiting requests, the stop, the request deadline ------------


@pytest.fixture
def slow_api_daemon(tmp_path):
    """Daemons with the API on a model slow enough (about a second a frame) that requests pile up."""
    from onnx_models import slow_model

    model = slow_model(tmp_path / "slow.onnx", seconds=0.6, size=256)
    started: list[DaemonProcess] = []

    def start(**sections) -> DaemonProcess:
        sections["api"] = {"enabled": True, "port": 0, **sections.get("api", {})}
        d = DaemonProcess(tmp_path / f"s{len(started)}", model, providers=["cpu"], **sections)
        started.append(d)
        d.start()
        d.url = wait_for(lambda: d.status().get("api"), what="the API address in the status file")
        return d

    yield start
    for d in started:
        d.close()


def refusals(d: DaemonProcess) -> list[str]:
    return [line for line in api_lines(d) if "POST /predict: " in line]


@pytest.mark.parametrize("how", ["client gone", "deadline"])
def test_abandoned_image_requests_do_not_hold_up_a_dropped_frame(slow_api_daemon, how):
    """30 image bodies nobody waits for any more (clients gone, or api.timeout_s passed), then a frame
    dropped: its map comes after its own inference, not after 30 others (tens of seconds)."""
    d = slow_api_daemon(api={"timeout_s": 0.5} if how == "deadline" else {}, daemon={"log_level": "debug"})
    body = jpeg_bytes(block_frame(2))
    client_timeout = 0.5 if how == "client gone" else HTTP_TIMEOUT

    def abandon(_: int) -> int | str:
        try:
            return requests.post(
                f"{d.url}/predict", data=body, headers={"Content-Type": "image/jpeg"}, timeout=client_timeout
            ).status_code
        except requests.exceptions.Timeout:
            return "gave up"

    with ThreadPoolExecutor(30) as pool:
        outcomes = list(pool.map(abandon, range(30)))
    assert set(outcomes) <= {"gave up" if how == "client gone" else 504, 503, 200}, outcomes
    assert 503 in outcomes, "beyond the bound, a request is answered 503 at once"
    # A request's end is one line (499 for a client gone); every job begun has been told to stop by then.
    begun = lambda: d.log().count("its job has begun")  # noqa: E731
    ended = lambda: d.log().count("its job was stopped") + len(re.findall(r"api: image body \d+x\d+ -> ", d.log()))  # noqa: E731
    wait_for(lambda: begun() and ended() == begun(), what="every image job begun to be stopped or answered")
    code = ": 499 " if how == "client gone" else ": 504 "
    assert all(code in line or "waiting already" in line for line in refusals(d)), refusals(d)
    write_by_rename(d.watch / "frame.jpg", jpeg_bytes(block_frame(3)))
    wait_for(lambda: d.counts().get("done") == 1, what="the dropped frame's map")
    counts = d.counts()
    own_ms = sum(counts["last_stage_ms"].values())
    assert counts["last_latency_ms"] < 2 * own_ms, f"waited {counts['last_latency_ms']:.0f} ms for a frame whose own work took {own_ms:.0f} ms"
    assert d.stop() == 0
    assert d.counts()["failed"] == 0


def test_stop_answers_waiting_image_requests_with_503(slow_api_daemon):
    """SIGTERM while image bodies wait and the shutdown has no time for them: each gets its 503."""
    d = slow_api_daemon(daemon={"shutdown_timeout_s": 0.5, "log_level": "debug"})
    body = jpeg_bytes(block_frame(4))
    begun = lambda: d.log().count("its job has begun")  # noqa: E731
    with ThreadPoolExecutor(6) as pool:
        pending = [
            pool.submit(requests.post, f"{d.url}/predict", data=body, headers={"Content-Type": "image/jpeg"}, timeout=HTTP_TIMEOUT)
            for _ in range(6)
        ]
        wait_for(lambda: begun() >= 3, what="image jobs in the pipeline")
        d.send(signal.SIGTERM)
        answers = [p.result(HTTP_TIMEOUT) for p in pending]  # a dropped connection raises here
    codes = [a.status_code for a in answers]
    assert 503 in codes and set(codes) <= {200, 503}, codes
    assert all(a.text.strip() == "the daemon is stopping; try again once it is back" for a in answers if a.status_code == 503)
    assert d.proc.wait(HTTP_TIMEOUT) == 0
    assert "threads still running" not in d.log()


def test_health_answers_while_many_requests_wait(api_daemon):
    """More requests waiting than request threads: the ones beyond the bound get 503 at once, /health answers."""
    from depthwatch.daemon.api import THREADS, WAITING

    d = api_daemon(restricted=True, api={"timeout_s": 600}, daemon={"retries": 100}, output={"template": "ro/depth.jpg"})
    ro = d.watch / "ro"
    ro.mkdir()
    ro.chmod(0o555)  # the map is retried and never lands: the requests wait until the stop
    try:
        (d.watch / "frame.jpg").write_bytes(jpeg_bytes(block_frame(13)))
        many = THREADS + 4
        with ThreadPoolExecutor(many) as pool:
            pending = [pool.submit(requests.post, f"{d.url}/predict", timeout=HTTP_TIMEOUT) for _ in range(many)]
            wait_for(lambda: sum(p.done() for p in pending) == many - WAITING, what="the requests beyond the bound to be answered")
            busy = [p.result() for p in pending if p.done()]
            assert all(a.status_code == 503 and "waiting already" in a.text for a in busy), [a.text for a in busy]
            for _ in range(3):
                health = requests.get(f"{d.url}/health", timeout=10)
                assert health.status_code == 200 and health.json()["state"] == "running"
            assert sum(p.done() for p in pending) == many - WAITING, "a waiting request was answered"
            d.send(signal.SIGTERM)
            answers = [p.result(HTTP_TIMEOUT) for p in pending]
        assert [a.status_code for a in answers].count(503) == many
        assert d.proc.wait(HTTP_TIMEOUT) == 0
    finally:
        ro.chmod(0o755)


def test_a_map_deleted_since_is_made_again_not_answered_done(api_daemon, reference):
    d = api_daemon()
    data = jpeg_bytes(block_frame(14))
    write_by_rename(d.watch / "frame.jpg", data)
    answer = requests.post(f"{d.url}/predict", timeout=HTTP_TIMEOUT)
    assert (answer.status_code, answer.text) == (200, "DONE")
    (d.watch / "depth.jpg").unlink()
    answer = requests.post(f"{d.url}/predict", timeout=HTTP_TIMEOUT)
    assert (answer.status_code, answer.text) == (200, "DONE")
    assert_same_map(decode_map((d.watch / "depth.jpg").read_bytes()), reference.depth(data))
    # A file of the user's in the map's place: 409 (the frame is fine; the map cannot be written), and
    # once it is gone the next request makes the map, not the last answer from memory (a 422 for good).
    (d.watch / "depth.jpg").write_bytes(b"the editor's own depth.jpg")
    answer = requests.post(f"{d.url}/predict", timeout=HTTP_TIMEOUT)
    assert answer.status_code == 409 and "is not a depth map depthwatch made" in answer.text, answer.text
    assert (d.watch / "depth.jpg").read_bytes() == b"the editor's own depth.jpg"
    (d.watch / "depth.jpg").unlink()
    answer = requests.post(f"{d.url}/predict", timeout=HTTP_TIMEOUT)
    assert (answer.status_code, answer.text) == (200, "DONE")
    assert_same_map(decode_map((d.watch / "depth.jpg").read_bytes()), reference.depth(data))
    assert d.stop() == 0
    assert d.counts()["done"] == 3


def test_a_map_deleted_while_its_job_is_still_being_reported_is_made_again(tmp_path, tiny_model, reference):
    """The job's result reaches the waiters a moment before the queue lets go of it (its log
    line lies in between); a request then, for the same version with its map deleted, must
    queue a new job, not be folded into the one that has just ended (a 504 thirty seconds on)."""
    import json
    import logging

    from depthwatch import config as configuration
    from depthwatch.daemon.lifecycle import Daemon

    watch = tmp_path / "watch"
    watch.mkdir()
    text = json.dumps({
        "model": {"path": str(tiny_model), "profile": "midas-v21-small", "providers": ["cpu"]},
        "watch": {"folders": [str(watch)], "patterns": ["frame.jpg"]},
        "output": {"template": "depth.jpg"},
        "daemon": {"workers": 2, "status_file": str(tmp_path / "status.json")},
        "api": {"enabled": True, "port": 0},
    })
    daemon = Daemon(configuration.parse(text, tmp_path / "config.yaml"))
    data = jpeg_bytes(block_frame(16))
    tickets = []

    class AgainBetweenResultAndDone(logging.Handler):
        """On the worker thread, at the frame's log line: after waiters.finished, before queue.done."""

        def emit(self, record: logging.LogRecord) -> None:
            if not tickets and record.getMessage().startswith("frame.jpg -> depth.jpg"):
                (watch / "depth.jpg").unlink()
                tickets.append(daemon.backend.request_map(watch / "frame.jpg"))

    frames_log, handler = logging.getLogger("depthwatch.frames"), AgainBetweenResultAndDone()
    level = logging.getLogger("depthwatch").level
    logging.getLogger("depthwatch").setLevel(logging.INFO)
    frames_log.addHandler(handler)
    thread = threading.Thread(target=daemon.run, name="embedded daemon")
    thread.start()
    try:
        wait_for(lambda: daemon.status.state == "running", what="the daemon running")
        write_by_rename(watch / "frame.jpg", data)
        wait_for(lambda: tickets, what="the request at the frame's log line")
        assert tickets[0].wait(HTTP_TIMEOUT).kind == DONE
        assert_same_map(decode_map((watch / "depth.jpg").read_bytes()), reference.depth(data))
        # Counted just after its answer went out (the worker thread answers waiters first): wait for it.
        wait_for(lambda: daemon.status.counts.done == 2, what="the second job counted")
    finally:
        frames_log.removeHandler(handler)
        logging.getLogger("depthwatch").setLevel(level)
        daemon.request_stop()
        thread.join(60)
    assert not thread.is_alive()  # (`stuck` would count the reference's own inference thread)


def test_a_request_trickling_in_is_cut_off_at_api_request_timeout_s(api_daemon, tmp_path):
    import select
    import socket
    import time

    from depthwatch import config as configuration
    from depthwatch.errors import ConfigError

    with pytest.raises(ConfigError, match="api.request_timeout_s must be between 0.1 and 3600"):
        configuration.parse("api:\n  request_timeout_s: 0\n", tmp_path / "config.yaml")
    assert ApiConfig().request_timeout_s == 30  # the default, as config.yaml says

    d = api_daemon(api={"request_timeout_s": 1})
    host, port = d.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=HTTP_TIMEOUT) as s:
        start = time.monotonic()
        s.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\nContent-Length: 100000\r\n\r\n")
        closed = False
        while not closed and time.monotonic() - start < HTTP_TIMEOUT:
            try:
                s.sendall(b"\xff")  # a byte every 0.1 s: never idle, never whole
                readable, _, _ = select.select([s], [], [], 0.1)
                closed = bool(readable) and s.recv(1) == b""
            except OSError:
                closed = True
        elapsed = time.monotonic() - start
    assert closed, "the trickling request was never cut off"
    assert 1.0 <= elapsed < 10 * machine_factor(), elapsed  # cut off by its 1 s, not by the client giving up
    wait_for(lambda: "did not arrive whole within 1 s (api.request_timeout_s)" in d.log(), what="the log line")
    write_by_rename(d.watch / "frame.jpg", jpeg_bytes(block_frame(15)))
    answer = requests.post(f"{d.url}/predict", timeout=HTTP_TIMEOUT)  # whole at once: well within it
    assert (answer.status_code, answer.text) == (200, "DONE")
    assert d.stop() == 0
