"""The systemd user unit: its text, `systemd-analyze verify`, the verbs on systemctl, and the daemon run its way.

There is no user manager on these machines, so `systemctl` and `journalctl`
are recording stand-ins on PATH for the verbs' command lines; the unit is
checked by the real `systemd-analyze verify` where it is installed, and the
daemon is started for real with the unit's ExecStart, WorkingDirectory and
Environment.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from service_support import (
    folder_snapshot,
    kill_quietly,
    make_project,
    process_one_frame,
    start_like_supervisor,
    stop_with_sigterm,
    supervisor_env,
    wait_exit,
    wait_running,
)
from standin import make_standins, path_with

from depthwatch import cli
from depthwatch.service import launchd, supervision, systemd
from depthwatch.errors import EX_CONFIG

ENTRY_POINT = str(Path(os.path.abspath(sys.executable)).parent / "depthwatch")
SHOW = ("show", "depthwatch.service", f"--property={','.join(systemd.SHOW_PROPERTIES)}")

ACTIVE = """\
LoadState=loaded
ActiveState=active
SubState=running
MainPID={pid}
ExecMainCode=0
ExecMainStatus=0
UnitFileState=enabled
"""
FAILED_78 = """\
LoadState=loaded
ActiveState=failed
SubState=failed
MainPID=0
ExecMainCode=1
ExecMainStatus=78
UnitFileState=enabled
"""
NOT_FOUND = "LoadState=not-found\nActiveState=inactive\nSubState=dead\nMainPID=0\nExecMainCode=0\nExecMainStatus=0\n"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    return home


@pytest.fixture
def config(tmp_path: Path, tiny_model: Path) -> Path:
    return make_project(tmp_path / "project", tiny_model)


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    standins = make_standins(tmp_path / "standins")
    monkeypatch.setenv("PATH", path_with(standins))
    standins.reply("systemctl show", {"out": NOT_FOUND})
    return standins


def service(*args: str) -> int:
    return cli.main(["service", *args, "--manager", "systemd"])


def systemctl(*args: str) -> list[str]:
    return ["systemctl", "--user", *args]


# -- the unit ---------------------------------------------------------------------------


def test_unit_has_the_restart_stop_and_exec_settings(config: Path):
    unit = systemd.parse(systemd.render(config, shutdown_timeout_s=10))
    service_section = unit["Service"]
    assert systemd.exec_start(unit) == [ENTRY_POINT, "run", "-c", str(config)]
    assert service_section["WorkingDirectory"] == [str(config.parent)]
    assert service_section["Restart"] == ["on-failure"]
    assert service_section["RestartPreventExitStatus"] == ["78"]
    assert service_section["KillSignal"] == ["SIGTERM"]
    assert service_section["TimeoutStopSec"] == ["15"]
    assert unit["Install"]["WantedBy"] == ["default.target"]
    env = systemd.environment_of(unit)
    assert env["PATH"].split(":")[0] == str(Path(ENTRY_POINT).parent) and "/usr/bin" in env["PATH"].split(":")
    assert "OBJC_DISABLE_INITIALIZE_FORK_SAFETY" not in env
    assert systemd.validate(systemd.render(config, shutdown_timeout_s=10)) == unit


def test_unit_and_plist_start_the_daemon_alike(config: Path, tmp_path: Path):
    """The same command line, working directory, PATH and stop timeout on both."""
    for shutdown in (0.5, 10, 19):
        unit = systemd.parse(systemd.render(config, shutdown_timeout_s=shutdown))
        plist = launchd.build(config, home=tmp_path, shutdown_timeout_s=shutdown)
        assert systemd.exec_start(unit) == plist["ProgramArguments"]
        assert unit["Service"]["WorkingDirectory"] == [plist["WorkingDirectory"]]
        assert int(unit["Service"]["TimeoutStopSec"][0]) == plist["ExitTimeOut"] == math.ceil(shutdown) + 5


@pytest.mark.parametrize(
    "word", ["plain", "with space", 'quote"d', "back\\slash", "50%", "$HOME", "${X}", "tab\there", "'single'"]
)
def test_command_line_words_survive_systemds_quoting(word: str):
    assert systemd.words(systemd.quote(word)) == [word]


def test_unit_dir_follows_xdg_config_home(tmp_path: Path):
    assert systemd.unit_dir(tmp_path, {}) == tmp_path / ".config/systemd/user"
    assert systemd.unit_dir(tmp_path, {"XDG_CONFIG_HOME": "/x/conf"}) == Path("/x/conf/systemd/user")
    assert systemd.unit_dir(tmp_path, {"XDG_CONFIG_HOME": "relative"}) == tmp_path / ".config/systemd/user"


def analyze(unit_file: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "SYSTEMD_LOG_COLOR": "0"}
    return subprocess.run(systemd.verify(unit_file), capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("folder", ["project", "my frames 100% $HOME"])
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path, tiny_model: Path, folder: str):
    config = make_project(tmp_path / folder, tiny_model)
    unit_file = tmp_path / "units" / systemd.UNIT
    unit_file.parent.mkdir()
    unit_file.write_text(systemd.render(config, shutdown_timeout_s=10))
    result = analyze(unit_file, tmp_path)
    assert result.returncode == 0, result.stderr
    # verify only warns about unknown keys and bad values; there must be none.
    assert str(unit_file) not in result.stderr + result.stdout, result.stderr
    assert systemd.config_of(unit_file.read_text()) == config


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_catches_a_missing_program(tmp_path: Path, config: Path):
    """The check above can fail: a unit whose ExecStart does not exist is refused."""
    unit_file = tmp_path / systemd.UNIT
    unit_file.write_text(systemd.render(config, shutdown_timeout_s=10).replace(ENTRY_POINT, str(tmp_path / "gone")))
    result = analyze(unit_file, tmp_path)
    assert result.returncode != 0 and "gone" in result.stderr


# -- the verbs' command lines -------------------------------------------------------------


def test_install_then_uninstall_run_systemctl_and_leave_the_folder_as_found(config: Path, home: Path, tools, capsys):
    units = home / ".config/systemd/user"
    units.mkdir(parents=True)
    (units / "other.service").write_text("[Service]\nExecStart=/bin/true\n")
    before = folder_snapshot(units)

    assert service("install", "-c", str(config)) == 0
    assert tools.calls() == [
        systemctl("daemon-reload"),
        systemctl("enable", "depthwatch.service"),
        systemctl("restart", "depthwatch.service"),
    ]
    unit_file = units / "depthwatch.service"
    assert unit_file.read_text() == systemd.render(config, shutdown_timeout_s=10)
    assert sorted(p.name for p in units.iterdir()) == ["depthwatch.service", "other.service"]
    assert "loginctl enable-linger" in capsys.readouterr().out

    tools.clear()
    tools.reply("systemctl show", {"out": ACTIVE.format(pid=99)})
    assert service("uninstall") == 0
    assert tools.calls() == [systemctl(*SHOW), systemctl("disable", "--now", "depthwatch.service"), systemctl("daemon-reload")]
    assert folder_snapshot(units) == before


def test_install_goes_where_xdg_config_home_says(config: Path, home: Path, tools, monkeypatch, tmp_path: Path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "conf"))
    assert service("install", "-c", str(config)) == 0
    assert (tmp_path / "conf/systemd/user/depthwatch.service").is_file()


def test_a_failed_install_puts_the_folder_back(config: Path, home: Path, tools, capsys):
    tools.reply("systemctl enable", {"rc": 1, "err": "Failed to connect to bus: No medium found\n"})
    assert service("install", "-c", str(config)) == 1
    assert "Failed to connect to bus" in capsys.readouterr().err
    assert list((home / ".config/systemd/user").iterdir()) == []
    assert tools.calls()[-1] == systemctl("daemon-reload")


def test_install_refuses_a_missing_model(config: Path, home: Path, tools, capsys):
    (config.parent.parent / "tiny.onnx").unlink()
    assert service("install", "-c", str(config)) == EX_CONFIG
    assert "does not exist" in capsys.readouterr().err
    assert tools.calls() == []


def test_start_stop_restart_logs_run_the_right_lines(config: Path, home: Path, tools, capsys):
    assert service("install", "-c", str(config)) == 0
    for verb in ("start", "stop", "restart"):
        tools.clear()
        assert service(verb) == 0
        expected = [systemctl(verb, "depthwatch.service")]
        if verb == "stop":
            expected.append(systemctl(*SHOW))
        assert tools.calls() == expected
    tools.clear()
    assert service("logs", "-n", "20") == 0
    assert service("logs", "--follow") == 0
    journal = ["journalctl", "--user", "--unit", "depthwatch.service", "--lines"]
    assert tools.calls() == [
        [*journal, "20", "--output", "cat", "--no-pager"],
        [*journal, "50", "--output", "cat", "--no-pager", "--follow"],
    ]


def test_verbs_on_a_unit_that_is_not_installed_say_so(home: Path, tools, capsys):
    for verb in ("start", "stop", "restart"):
        assert service(verb) == 1
        assert "not installed" in capsys.readouterr().err
    assert service("uninstall") == 0
    assert tools.calls() == [systemctl(*SHOW)]


def test_status_reads_systemctl_show(config: Path, home: Path, tools, capsys):
    assert service("install", "-c", str(config)) == 0
    capsys.readouterr()
    tools.reply("systemctl show", {"out": ACTIVE.format(pid=4242)})
    assert service("status") == 0
    out = capsys.readouterr().out
    assert "running:     yes, pid 4242 (active (running))" in out
    assert f"config:      {config}" in out and "status file: " in out

    tools.reply("systemctl show", {"out": FAILED_78})
    assert service("status") == 3
    assert "last exit:   78 (EX_CONFIG" in capsys.readouterr().out

    crashed = "LoadState=loaded\nActiveState=activating\nSubState=auto-restart\nExecMainCode=2\nExecMainStatus=11\n"
    state = systemd.parse_show(crashed)
    assert (state.running, state.last_exit, state.last_signal) == (False, None, 11)


# -- the daemon, started the way the unit starts it ---------------------------------------


def start_from_unit(unit_text: str, home: Path, logs: Path) -> subprocess.Popen[bytes]:
    unit = systemd.parse(unit_text)
    return start_like_supervisor(
        systemd.exec_start(unit),
        cwd=unit["Service"]["WorkingDirectory"][-1].replace("%%", "%"),
        env=supervisor_env(home, systemd.environment_of(unit)),
        stdout=logs / "stdout.log",
        stderr=logs / "stderr.log",
    )


def test_the_daemon_started_as_the_unit_says_processes_a_frame_and_stops_on_sigterm(tmp_path: Path, tiny_model: Path, home: Path):
    # A folder name that needs systemd's quoting and escaping in ExecStart.
    config = make_project(tmp_path / "my frames 100% $HOME", tiny_model)
    text = systemd.render(config, shutdown_timeout_s=10)
    stop_timeout = int(systemd.parse(text)["Service"]["TimeoutStopSec"][-1])
    log = tmp_path / "logs" / "stderr.log"
    proc = start_from_unit(text, home, log.parent)
    try:
        wait_running(proc, config.parent / "status.json", log)
        process_one_frame(proc, config.parent / "frames", log)
        code, seconds = stop_with_sigterm(proc, stop_timeout)
    finally:
        kill_quietly(proc)
    assert code == 0, log.read_text()
    assert seconds < stop_timeout
    assert log.read_text().rstrip().endswith("stopped")


def test_a_missing_model_exits_78_which_the_unit_does_not_restart(config: Path, home: Path, tmp_path: Path):
    text = systemd.render(config, shutdown_timeout_s=10)
    assert systemd.parse(text)["Service"]["RestartPreventExitStatus"] == [str(EX_CONFIG)]
    (config.parent.parent / "tiny.onnx").unlink()
    log = tmp_path / "logs" / "stderr.log"
    proc = start_from_unit(text, home, log.parent)
    try:
        assert wait_exit(proc) == EX_CONFIG
    finally:
        kill_quietly(proc)
    assert log.read_text().splitlines()[-1].startswith("depthwatch: model file ")
    assert supervision.describe_exit(EX_CONFIG).startswith("78 (EX_CONFIG")
