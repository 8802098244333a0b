"""The systemd user unit: its text, `systemd-analyze verify`, the verbs on systemctl, and the daemon run its way.

There is no user manager on these machines, so `systemctl` and `journalctl`
are recording stand-ins on PATH for the verbs' command lines; the unit is
checked by the real `systemd-analyze verify` where it is installed, and the
daemon is started for real with the unit's ExecStart, WorkingDirectory and
Environment.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_process import wait_for
from service_support import (
    DOCUMENTED_CONFIG,
    folder_snapshot,
    kill_quietly,
    make_project,
    new_user,
    process_one_frame,
    start_like_supervisor,
    stop_with_sigterm,
    supervisor_env,
    tree,
    wait_exit,
    wait_running,
)
from standin import make_standins, path_with

from depthwatch import cli
from depthwatch.daemon.status import read_status
from depthwatch.errors import EX_CONFIG
from depthwatch.service import launchd, supervision, unitfile
from depthwatch.service.systemctl import ENVIRONMENT_D_GENERATORS, SHOW_PROPERTIES, parse_show, verify

REPO = Path(__file__).resolve().parents[1]
ENTRY_POINT = str(Path(os.path.abspath(sys.executable)).parent / "depthwatch")
SHOW = ("show", "depthwatch.service", f"--property={','.join(SHOW_PROPERTIES)}")

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
STOPPED = ACTIVE.replace("ActiveState=active", "ActiveState=inactive").replace("SubState=running", "SubState=dead").format(pid=0)
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


def test_the_unit_restarts_a_daemon_that_stops_answering(config: Path):
    """The unit has a watchdog: a daemon wedged whole (that cannot even exit) is killed and started again."""
    service_section = unitfile.parse(unitfile.render(config, shutdown_timeout_s=10))["Service"]
    assert service_section["WatchdogSec"] == [str(unitfile.WATCHDOG_SEC)]
    assert service_section["Restart"] == ["on-failure"]  # systemd's watchdog kill counts as a failure


def test_unit_has_the_restart_stop_and_exec_settings(config: Path):
    unit = unitfile.parse(unitfile.render(config, shutdown_timeout_s=10))
    service_section = unit["Service"]
    assert unitfile.exec_start(unit) == [ENTRY_POINT, "run", "-c", str(config)]
    assert service_section["WorkingDirectory"] == [str(config.parent)]
    assert service_section["Restart"] == ["on-failure"]
    assert service_section["RestartPreventExitStatus"] == ["78 200 203"]
    assert service_section["KillSignal"] == ["SIGTERM"]
    assert service_section["TimeoutStopSec"] == ["15"]
    assert service_section["Type"] == ["notify"]  # `systemctl start` waits for READY=1
    assert service_section["ExecReload"] == ["kill -HUP $MAINPID"]
    assert int(service_section["TimeoutStartSec"][-1]) >= 90 + 60  # provider measurement, then the load
    assert unit["Install"]["WantedBy"] == ["default.target"]
    env = unitfile.environment_of(unit)
    assert env["PATH"].split(":")[0] == str(Path(ENTRY_POINT).parent) and "/usr/bin" in env["PATH"].split(":")
    assert "OBJC_DISABLE_INITIALIZE_FORK_SAFETY" not in env
    assert unitfile.validate(unitfile.render(config, shutdown_timeout_s=10)) == unit


def test_unit_and_plist_start_the_daemon_alike(config: Path, tmp_path: Path):
    """The same command line, working directory, PATH and stop timeout on both."""
    for shutdown in (0.5, 10, 19):
        unit = unitfile.parse(unitfile.render(config, shutdown_timeout_s=shutdown))
        plist = launchd.build(config, home=tmp_path, shutdown_timeout_s=shutdown)
        assert unitfile.exec_start(unit) == plist["ProgramArguments"]
        assert unit["Service"]["WorkingDirectory"] == [plist["WorkingDirectory"]]
        assert int(unit["Service"]["TimeoutStopSec"][0]) == plist["ExitTimeOut"] >= shutdown + 5


@pytest.mark.parametrize(
    "word", ["plain", "with space", 'quote"d', "back\\slash", "50%", "$HOME", "${X}", "tab\there", "'single'"]
)
def test_command_line_words_survive_systemds_quoting(word: str):
    assert unitfile.words(unitfile.quote(word)) == [word]


def test_unit_dir_follows_xdg_config_home(tmp_path: Path):
    assert unitfile.unit_dir(tmp_path, {}) == tmp_path / ".config/systemd/user"
    assert unitfile.unit_dir(tmp_path, {"XDG_CONFIG_HOME": "/x/conf"}) == Path("/x/conf/systemd/user")
    assert unitfile.unit_dir(tmp_path, {"XDG_CONFIG_HOME": "relative"}) == tmp_path / ".config/systemd/user"


def analyze(unit_file: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "SYSTEMD_LOG_COLOR": "0"}
    return subprocess.run(verify(unit_file), capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("folder", ["project", "my frames 100% $HOME"])
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path, tiny_model: Path, folder: str):
    config = make_project(tmp_path / folder, tiny_model)
    unit_file = tmp_path / "units" / unitfile.UNIT
    unit_file.parent.mkdir()
    unit_file.write_text(unitfile.render(config, shutdown_timeout_s=10))
    result = analyze(unit_file, tmp_path)
    assert result.returncode == 0, result.stderr
    # verify only warns about unknown keys and bad values; there must be none.
    assert str(unit_file) not in result.stderr + result.stdout, result.stderr
    assert unitfile.config_of(unit_file.read_text()) == config


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_catches_a_missing_program(tmp_path: Path, config: Path):
    """The check above can fail: a unit whose ExecStart does not exist is refused."""
    unit_file = tmp_path / unitfile.UNIT
    unit_file.write_text(unitfile.render(config, shutdown_timeout_s=10).replace(ENTRY_POINT, str(tmp_path / "gone")))
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
    assert unit_file.read_text() == unitfile.render(config, shutdown_timeout_s=10)
    assert sorted(p.name for p in units.iterdir()) == ["depthwatch.service", "other.service"]
    assert "loginctl enable-linger" in capsys.readouterr().out

    tools.clear()
    tools.reply("systemctl show", {"out": ACTIVE.format(pid=99)}, {"out": STOPPED})
    assert service("uninstall") == 0
    assert tools.calls() == [
        systemctl(*SHOW), systemctl("disable", "--now", "depthwatch.service"), systemctl(*SHOW), systemctl("daemon-reload"),
    ]
    assert folder_snapshot(units) == before


def test_uninstall_says_stopped_only_once_systemd_says_so(config: Path, home: Path, tools, capsys):
    """A `disable --now` whose stop failed (a cancelled job): not "stopped and removed", exit 0,
    with the daemon running on under a unit file that is gone."""
    assert service("install", "-c", str(config)) == 0
    unit_file = home / ".config/systemd/user/depthwatch.service"
    tools.clear()
    capsys.readouterr()
    tools.reply("systemctl show", {"out": ACTIVE.format(pid=99)})
    tools.reply("systemctl disable", {"rc": 1, "err": "Job for depthwatch.service canceled.\n"})
    tools.reply("systemctl stop", {"rc": 1, "err": "Job for depthwatch.service canceled.\n"})
    assert service("uninstall") != 0
    said = capsys.readouterr()
    assert "stopped" not in said.out and said.err.count("\n") == 1 and "depthwatch.service canceled" in said.err, said
    assert unit_file.is_file()  # nothing removed under a daemon that runs
    # The stop works the second time: stopped, then removed.
    tools.clear()
    tools.reply("systemctl show", {"out": ACTIVE.format(pid=99)}, {"out": ACTIVE.format(pid=99)}, {"out": STOPPED})
    tools.reply("systemctl stop", {})
    assert service("uninstall") == 0
    assert systemctl("stop", "depthwatch.service") in tools.calls() and not unit_file.exists()


def test_install_goes_where_xdg_config_home_says(config: Path, home: Path, tools, monkeypatch, tmp_path: Path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "conf"))
    assert service("install", "-c", str(config)) == 0
    assert (tmp_path / "conf/systemd/user/depthwatch.service").is_file()


def test_a_failed_install_puts_the_folder_back(config: Path, home: Path, tools, capsys):
    tools.reply("systemctl enable", {"rc": 1, "err": "Failed to enable unit: Unit file depthwatch.service is masked.\n"})
    assert service("install", "-c", str(config)) == 1
    assert "Unit file depthwatch.service is masked" in capsys.readouterr().err
    assert tree(home) == {}, "no unit file, and not the folders made for it"
    assert tools.calls()[-1] == systemctl("daemon-reload")


def test_a_first_install_whose_start_fails_is_disabled_again_before_its_unit_goes(config: Path, home: Path, tools, capsys):
    """`enable` made the wants link; the unit's start failing must not leave it behind, dangling."""
    tools.reply("systemctl restart", {"rc": 1, "err": "Job for depthwatch.service failed because the control process exited.\n"})
    assert service("install", "-c", str(config)) == 1
    calls = tools.calls()
    assert calls.index(systemctl("disable", "--now", "depthwatch.service")) > calls.index(systemctl("restart", "depthwatch.service"))
    assert calls[-1] == systemctl("daemon-reload")
    assert tree(home) == {}


def test_install_without_a_config_writes_the_documented_one_and_the_service_runs_with_it(
    home: Path, tiny_model: Path, tools, capsys, monkeypatch, tmp_path: Path
):
    user_config = new_user(home, monkeypatch, fetched=True)
    assert service("install") == 0
    out = capsys.readouterr().out
    assert user_config.read_bytes() == DOCUMENTED_CONFIG.read_bytes()
    [said] = [line for line in out.splitlines() if str(user_config) in line]
    assert "wrote the documented default" in said and "edit it" in said
    unit_text = (home / ".config/systemd/user/depthwatch.service").read_text()
    assert unitfile.exec_start(unitfile.parse(unit_text))[-2:] == ["-c", str(user_config)]
    assert tools.calls()[-1] == systemctl("restart", "depthwatch.service")

    # The daemon, started as the unit says, runs with that config: it watches tmp/ beside it.
    log = tmp_path / "logs" / "stderr.log"
    proc = start_from_unit(unit_text, home, log.parent)
    try:
        def watching() -> bool:
            assert proc.poll() is None, log.read_text()
            return "ready: watching 1 folder(s)" in log.read_text()

        wait_for(watching, what="the daemon to start watching")
        frames = user_config.parent / "tmp"
        assert frames.is_dir()
        process_one_frame(proc, frames, log)
        code, _ = stop_with_sigterm(proc, 30)
    finally:
        kill_quietly(proc)
    assert code == 0, log.read_text()

    # Installing again keeps the config the user may have edited since.
    user_config.write_text(user_config.read_text().replace("shutdown_timeout_s: 10", "shutdown_timeout_s: 3"))
    edited = user_config.read_bytes()
    assert service("install") == 0
    assert user_config.read_bytes() == edited
    assert "wrote" not in capsys.readouterr().out
    assert "TimeoutStopSec=8" in (home / ".config/systemd/user/depthwatch.service").read_text()


def test_install_never_writes_over_what_is_at_the_user_config_path(home: Path, tiny_model: Path, tools, capsys, monkeypatch):
    user_config = new_user(home, monkeypatch, fetched=True)
    user_config.parent.mkdir(parents=True)
    user_config.symlink_to(home / "config-on-an-unmounted-volume.yaml")
    before = tree(home)
    assert service("install") == EX_CONFIG
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{user_config} exists but is not a config file" in err
    assert tree(home) == before
    assert tools.calls() == []


def test_an_installed_package_writes_the_documented_config_from_its_own_files(
    home: Path, tiny_model: Path, tools, monkeypatch, tmp_path: Path
):
    """depthwatch/default_config.yaml points at config.yaml and is package data; a copy of the package
    made as a wheel build makes it (links followed, no repository around it) installs with it."""
    link = REPO / "depthwatch" / "default_config.yaml"
    assert link.is_symlink() and link.resolve() == DOCUMENTED_CONFIG
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert "default_config.yaml" in pyproject["tool"]["setuptools"]["package-data"]["depthwatch"]

    user_config = new_user(home, monkeypatch, fetched=True)
    site = tmp_path / "site"
    shutil.copytree(REPO / "depthwatch", site / "depthwatch", ignore=shutil.ignore_patterns("__pycache__"))
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import depthwatch.cli as c; "
        "assert c.__file__.startswith(sys.argv[1]), c.__file__; sys.exit(c.main(['service', 'install', '--manager', 'systemd']))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEPTHWATCH_", "XDG_"))}
    ran = subprocess.run(
        [sys.executable, "-I", "-c", script, str(site)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert user_config.read_bytes() == DOCUMENTED_CONFIG.read_bytes()


def test_print_without_a_config_shows_what_install_would_write(home: Path, tiny_model: Path, tools, capsys, monkeypatch):
    user_config = new_user(home, monkeypatch, fetched=True)
    before = tree(home)
    assert service("print") == 0
    printed = capsys.readouterr()
    assert printed.err.count("\n") == 1 and f"install writes the documented default to {user_config}" in printed.err
    assert tree(home) == before, "print writes nothing"
    assert tools.calls() == []
    assert service("install") == 0
    assert (home / ".config/systemd/user/depthwatch.service").read_text() == printed.out


@pytest.mark.parametrize(
    "refusal",
    [
        "Failed to connect to bus: No medium found",
        "Failed to connect to user scope bus via local transport: $DBUS_SESSION_BUS_ADDRESS and $XDG_RUNTIME_DIR "
        "not defined (consider using --machine=<user>@.host --user to connect to bus of other user)",
    ],
)
def test_an_unreachable_user_manager_is_one_line_and_install_leaves_nothing(
    home: Path, tiny_model: Path, tools, capsys, monkeypatch, refusal: str
):
    new_user(home, monkeypatch, fetched=True)
    before = tree(home)
    tools.reply("systemctl daemon-reload", {"rc": 1, "err": refusal + "\n"})
    tools.reply("systemctl show", {"rc": 1, "err": refusal + "\n"})
    assert service("install") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("depthwatch: the systemd user manager is unreachable (Failed to connect to")
    assert "XDG_RUNTIME_DIR is unset" in err and "loginctl enable-linger $USER" in err and "not su or sudo" in err
    assert tree(home) == before, "no unit, no folder, no config from the failed attempt"

    # Status says the same, instead of "loaded: no".
    assert service("status") == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "user manager is unreachable" in err


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
        if verb == "stop":  # asked first (a running daemon whose unit file is gone is stopped too), and after
            expected = [systemctl(*SHOW), *expected, systemctl(*SHOW)]
        assert tools.calls() == expected
    tools.clear()
    assert service("logs", "-n", "20") == 0
    assert service("logs", "--follow") == 0
    journal = ["journalctl", "--user", "--unit", "depthwatch.service", "--lines"]
    assert tools.calls() == [
        [*journal, "20", "--output", "cat", "--no-pager"],
        [*journal, "50", "--output", "cat", "--no-pager", "--follow"],
    ]


def test_the_real_systemctl_without_a_user_session_is_one_line_and_install_leaves_nothing(
    home: Path, tiny_model: Path, capsys, monkeypatch
):
    """No stand-in: where systemctl is installed but no user manager runs for this login (containers, su, cron)."""
    if shutil.which("systemctl") is None:
        pytest.skip("systemctl is not installed")
    new_user(home, monkeypatch, fetched=True)
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    probe = subprocess.run(["systemctl", "--user", "show-environment"], capture_output=True, text=True, timeout=60)
    if probe.returncode == 0 or "Failed to connect to" not in probe.stderr:
        pytest.skip(f"systemctl --user here does not lack a bus ({probe.stderr.strip() or 'it works'}); the stand-ins cover it")
    before = tree(home)
    assert service("install") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "user manager is unreachable" in err and "loginctl enable-linger" in err, err
    assert tree(home) == before


@pytest.mark.parametrize("empty", ["", "-- No entries --\n"])
def test_logs_of_an_empty_journal_say_so(home: Path, tools, capsys, empty: str):
    tools.reply("journalctl depthwatch.service", {"out": empty})
    assert service("logs") == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "depthwatch: the journal has no lines from depthwatch.service yet; `depthwatch service status` says whether it ran\n"

    tools.reply("journalctl depthwatch.service", {"out": "ready: watching 1 folder(s)\n"})
    assert service("logs") == 0
    assert capsys.readouterr() == ("ready: watching 1 folder(s)\n", "")


def test_verbs_on_a_unit_that_is_not_installed_say_so(home: Path, tools, capsys):
    for verb in ("start", "stop", "restart"):
        assert service(verb) == 1
        assert "not installed" in capsys.readouterr().err
    assert service("uninstall") == 0
    assert tools.calls() == [systemctl(*SHOW), systemctl(*SHOW)]  # stop asks whether a daemon runs all the same


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
    state = parse_show(crashed)
    assert (state.running, state.last_exit, state.last_signal) == (False, None, 11)


def test_what_systemd_says_is_said_truly_starting_gone_unit_exec_errors_and_sigkill(config: Path, home: Path, tools, capsys):
    """A starting daemon (Type=notify, until READY=1) is not "running: no"; a daemon whose unit file
    was deleted is not "not installed, nothing to do" for status, stop and uninstall while it runs on;
    systemd's 203 (the virtualenv moved) does not read "killed by signal 75"; a stop that ended in
    SIGKILL does not say "exit status none yet"."""
    starting = "LoadState=loaded\nActiveState=activating\nSubState=start\nMainPID=4242\nExecMainCode=0\nExecMainStatus=0\n"
    assert parse_show(starting).running
    gone = "LoadState=not-found\nActiveState=active\nSubState=running\nMainPID=4242\nExecMainCode=0\nExecMainStatus=0\n"
    tools.reply("systemctl show", {"out": gone}, {"out": gone}, {"out": gone}, {"out": NOT_FOUND})  # `disable --now` left it
    assert service("status") == 0
    out = capsys.readouterr().out
    assert "loaded:      no (its definition is gone; the daemon still runs)" in out and "running:     yes, pid 4242" in out
    tools.clear()
    assert service("uninstall") == 0
    assert systemctl("stop", "depthwatch.service") in tools.calls()
    moved = "LoadState=loaded\nActiveState=failed\nSubState=failed\nMainPID=0\nExecMainCode=1\nExecMainStatus=203\n"
    tools.reply("systemctl show", {"out": moved})
    assert service("install", "-c", str(config)) == 0
    capsys.readouterr()
    assert service("status") == 3
    assert "last exit:   203 (systemd could not run the program: the virtualenv moved" in capsys.readouterr().out
    killed = "LoadState=loaded\nActiveState=failed\nSubState=failed\nMainPID=0\nExecMainCode=2\nExecMainStatus=9\n"
    tools.reply("systemctl show", {"out": ACTIVE.format(pid=4242)}, {"out": killed})
    assert service("stop") == 0
    assert "stopped depthwatch.service (killed by signal 9, SIGKILL: it did not stop in time" in capsys.readouterr().out
    tools.reply("systemctl show", {"out": killed})  # not after a stop: anyone's kill -9, the OOM killer
    assert service("status") == 3
    out = capsys.readouterr().out
    assert "last exit:   killed by signal 9 (SIGKILL)" in out and "did not stop in time" not in out


@pytest.mark.parametrize("odd", ["nl\nx", "esc\x1b[31m", "ends\\"])
def test_a_config_whose_path_a_unit_cannot_name_is_one_line(tmp_path: Path, tiny_model: Path, home: Path, tools, capsys, odd: str):
    """A config whose folder a unit cannot name is refused in one line, nothing installed: a newline in it
    would be a ValueError traceback, and a trailing backslash would make WorkingDirectory= a line
    continuation that swallows the next line, which verify passes."""
    config = make_project(tmp_path / odd, tiny_model)
    assert service("install", "-c", str(config)) == EX_CONFIG
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "which a launchd plist or a systemd unit cannot name" in err, err
    assert tools.calls() == [] and not unitfile.unit_path(home, os.environ).exists()


def test_install_checks_the_config_with_what_the_user_manager_hands_every_service(config: Path, home: Path, tools, capsys, monkeypatch):
    """A variable of the shell alone is refused (the service would exit 78 at every start); one the
    user manager hands every unit at each of its starts (environment.d) is the service's too. One it
    holds only until the next boot (set-environment, a login session's) is refused with where to put it:
    taken as the service's, it would be installed and started, then exit 78 at every start after a reboot."""
    generator = next((g for g in ENVIRONMENT_D_GENERATORS if os.access(g, os.X_OK)), None)
    if generator is None:
        pytest.skip("systemd's environment.d generator is not installed (Debian's systemd package; .ci/run installs it)")
    monkeypatch.setenv("SHOTS", str(config.parent))
    config.write_text(config.read_text().replace("- frames", "- $SHOTS/frames"))
    tools.reply("systemctl show-environment", {"out": "LANG=C.UTF-8\nPATH=/usr/bin\n"})
    assert service("install", "-c", str(config)) == EX_CONFIG
    assert "watch.folders uses $SHOTS, which is not set here" in capsys.readouterr().err
    tools.reply("systemctl show-environment", {"out": f"LANG=C.UTF-8\nSHOTS={config.parent}\n"})
    assert service("install", "-c", str(config)) == EX_CONFIG
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the user manager has it now" in err and "~/.config/environment.d/depthwatch.conf" in err, err
    assert not unitfile.unit_path(home, os.environ).exists()
    (home / ".config" / "environment.d").mkdir(parents=True)
    (home / ".config" / "environment.d" / "depthwatch.conf").write_text(f"SHOTS={config.parent}\n")
    assert service("install", "-c", str(config)) == 0
    assert systemctl("restart", "depthwatch.service") in tools.calls()


def test_a_failed_reinstall_starts_the_old_service_again(config: Path, home: Path, tools, capsys):
    """`systemctl restart` stops the old daemon, then the new unit fails: the old unit is put back and
    started again, and the install says so, so the service that was mapping frames does not stay down, unsaid."""
    assert service("install", "-c", str(config)) == 0
    old = unitfile.unit_path(home, os.environ).read_bytes()
    tools.clear()
    tools.reply("systemctl show", {"out": ACTIVE.format(pid=4242)})
    tools.reply("systemctl restart", {"rc": 1, "err": "Job for depthwatch.service failed.\n"}, {"rc": 0})
    assert service("install", "-c", str(config)) == 1
    assert unitfile.unit_path(home, os.environ).read_bytes() == old
    calls = tools.calls()
    assert calls[-2:] == [systemctl("daemon-reload"), systemctl("restart", "depthwatch.service")], calls
    assert "depthwatch.service runs again with the unit it had" in capsys.readouterr().err


# -- the daemon, started the way the unit starts it ---------------------------------------


def start_from_unit(unit_text: str, home: Path, logs: Path, notify_socket: str | None = None) -> subprocess.Popen[bytes]:
    unit = unitfile.parse(unit_text)
    env = supervisor_env(home, unitfile.environment_of(unit))
    if notify_socket is not None:  # what systemd sets for a Type=notify service
        env["NOTIFY_SOCKET"] = notify_socket
    return start_like_supervisor(
        unitfile.exec_start(unit),
        cwd=unit["Service"]["WorkingDirectory"][-1].replace("%%", "%"),
        env=env,
        stdout=logs / "stdout.log",
        stderr=logs / "stderr.log",
    )


def test_the_daemon_started_as_the_unit_says_processes_a_frame_and_stops_on_sigterm(tmp_path: Path, tiny_model: Path, home: Path):
    # A folder name that needs systemd's quoting and escaping in ExecStart.
    config = make_project(tmp_path / "my frames 100% $HOME", tiny_model)
    text = unitfile.render(config, shutdown_timeout_s=10)
    stop_timeout = int(unitfile.parse(text)["Service"]["TimeoutStopSec"][-1])
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
    text = unitfile.render(config, shutdown_timeout_s=10)
    assert unitfile.parse(text)["Service"]["RestartPreventExitStatus"] == [f"{EX_CONFIG} 200 203"]
    (config.parent.parent / "tiny.onnx").unlink()
    log = tmp_path / "logs" / "stderr.log"
    proc = start_from_unit(text, home, log.parent)
    try:
        assert wait_exit(proc) == EX_CONFIG
    finally:
        kill_quietly(proc)
    assert log.read_text().splitlines()[-1].startswith("depthwatch: model file ")
    assert supervision.describe_exit(EX_CONFIG).startswith("78 (EX_CONFIG")


@contextlib.contextmanager
def notify_socket() -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket bound where systemd would bind its notify socket (abstract namespace)."""
    name = f"@depthwatch-test-notify-{os.getpid()}-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind("\0" + name[1:])
        yield name, sock
    finally:
        sock.close()


def receive(sock: socket.socket, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> list[str]:
    """The next notification's fields, as systemd reads them."""
    deadline = time.monotonic() + timeout
    while True:
        ready, _, _ = select.select([sock], [], [], 0.1)
        if ready:
            return sock.recv(4096).decode().splitlines()
        if proc.poll() is not None:
            raise AssertionError(f"the daemon exited with {proc.returncode} before notifying:\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no notification within {timeout:.0f} s:\n{log.read_text()}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="systemd's notify socket is a Linux abstract socket here")
def test_the_daemon_sends_ready_only_once_the_model_is_loaded_and_stopping_at_sigterm(tmp_path: Path, tiny_model: Path, home: Path):
    config = make_project(tmp_path / "project", tiny_model)
    text = unitfile.render(config, shutdown_timeout_s=10)
    log = tmp_path / "logs" / "stderr.log"
    with notify_socket() as (name, sock):
        proc = start_from_unit(text, home, log.parent, notify_socket=name)
        try:
            fields = receive(sock, proc, log)
            # What the daemon had done when it said READY: the model loaded, the folders watched.
            said, status = log.read_text(), read_status(config.parent / "status.json")
            proc.send_signal(signal.SIGTERM)
            stopping = receive(sock, proc, log)
            code = wait_exit(proc)
        finally:
            kill_quietly(proc)
    assert fields[0] == "READY=1" and fields[1] == "STATUS=watching 1 folder(s)", fields
    assert "model tiny.onnx (profile midas-v21-small" in said and "ready: watching 1 folder(s)" in said, said
    assert status["state"] == "running" and status["model_loads"] == 1, status
    assert stopping == ["STOPPING=1"]
    assert code == 0, log.read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="systemd's notify socket is a Linux abstract socket here")
def test_a_model_that_does_not_load_never_sends_ready_so_systemctl_start_fails(tmp_path: Path, tiny_model: Path, home: Path):
    config = make_project(tmp_path / "project", tiny_model)
    (config.parent.parent / "tiny.onnx").write_bytes(b"not an onnx model")
    log = tmp_path / "logs" / "stderr.log"
    with notify_socket() as (name, sock):
        proc = start_from_unit(unitfile.render(config, shutdown_timeout_s=10), home, log.parent, notify_socket=name)
        try:
            code = wait_exit(proc)
        finally:
            kill_quietly(proc)
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            sock.recv(4096)  # nothing was ever sent
    assert code == EX_CONFIG, log.read_text()
