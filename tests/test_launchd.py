"""The LaunchAgent: the plist, the `depthwatch service` verbs on launchctl, and the daemon run its way.

launchd does not exist on Linux, so `launchctl` and `plutil` are recording
stand-ins on PATH (see standin.py) for the verbs' command lines; the plist is
real, and the daemon is started for real with the plist's argv, working
directory, environment and log files.
"""

from __future__ import annotations

import os
import plistlib
import re
import selectors
import shutil
import signal
import subprocess
import sys
import xml.sax.saxutils
from pathlib import Path

import pytest
import yaml
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

from depthwatch import cli, paths
from depthwatch.daemon.status import Status, read_status, write_status
from depthwatch.errors import EX_CONFIG, DepthwatchError
from depthwatch.service import launchd, supervision

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "launchd" / f"{launchd.LABEL}.plist.template"
UID = os.getuid()
TARGET = f"gui/{UID}/{launchd.LABEL}"
ENTRY_POINT = str(Path(os.path.abspath(sys.executable)).parent / "depthwatch")

RUNNING = """\
gui/{uid}/com.depthwatch.agent = {{
\tactive count = 1
\tpath = /Users/me/Library/LaunchAgents/com.depthwatch.agent.plist
\ttype = LaunchAgent
\tstate = running

\tprogram = /Users/me/venv/bin/depthwatch
\targuments = {{
\t\t/Users/me/venv/bin/depthwatch
\t\trun
\t}}

\truns = 1
\tpid = {pid}
\tlast exit code = (never exited)
\tendpoints = {{
\t\tstate = active
\t}}
}}
"""
STOPPED = "gui/{uid}/com.depthwatch.agent = {{\n\tstate = not running\n\truns = 2\n\tlast exit code = {code}\n}}\n"
NOT_LOADED = {"rc": 113, "err": f'Could not find service "{launchd.LABEL}" in domain for user gui: {UID}\n'}


def running(pid: int = 4242) -> dict[str, object]:
    return {"out": RUNNING.format(uid=UID, pid=pid)}


def stopped(code: str = "0") -> dict[str, object]:
    return {"out": STOPPED.format(uid=UID, code=code)}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture
def config(tmp_path: Path, tiny_model: Path) -> Path:
    return make_project(tmp_path / "project", tiny_model)


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    standins = make_standins(tmp_path / "standins")
    monkeypatch.setenv("PATH", path_with(standins))
    standins.reply("launchctl print", NOT_LOADED)
    return standins


def service(*args: str) -> int:
    return cli.main(["service", *args, "--manager", "launchd"])


def built(config: Path, home: Path, shutdown_timeout_s: float = 10.0, executable: str | None = None) -> dict:
    return launchd.build(config, home=home, shutdown_timeout_s=shutdown_timeout_s, executable=executable)


# -- the plist --------------------------------------------------------------------------


def test_plist_has_every_key_with_the_right_type_and_existing_absolute_paths(config: Path, home: Path):
    launchd.log_dir(home).mkdir(parents=True)
    data = launchd.dumps(built(config, home))
    plist = plistlib.loads(data)

    assert plist["Label"] == "com.depthwatch.agent"
    assert plist["ProgramArguments"] == [ENTRY_POINT, "run", "-c", str(config)]
    program = Path(plist["ProgramArguments"][0])
    assert program.is_absolute() and program.is_file() and os.access(program, os.X_OK)
    assert Path(plist["ProgramArguments"][-1]).is_absolute() and Path(plist["ProgramArguments"][-1]).is_file()
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False, "Crashed": True}
    assert type(plist["ThrottleInterval"]) is int and plist["ThrottleInterval"] == 30
    assert plist["ProcessType"] == "Interactive"
    assert type(plist["ExitTimeOut"]) is int and plist["ExitTimeOut"] == 15
    assert plist["WorkingDirectory"] == str(config.parent) and Path(plist["WorkingDirectory"]).is_dir()
    assert plist["StandardOutPath"] == str(home / "Library/Logs/depthwatch/depthwatch.out.log")
    assert plist["StandardErrorPath"] == str(home / "Library/Logs/depthwatch/depthwatch.out.log")
    assert plist["EnvironmentVariables"]["DEPTHWATCH_LOG_FILE"] == str(home / "Library/Logs/depthwatch/depthwatch.log")
    for key in ("StandardOutPath", "StandardErrorPath"):
        assert Path(plist[key]).is_absolute() and Path(plist[key]).parent.is_dir()
    env = plist["EnvironmentVariables"]
    assert all(type(k) is str and type(v) is str for k, v in env.items())
    assert env["PATH"].split(":")[0] == str(program.parent)
    assert {"/usr/bin", "/bin", "/opt/homebrew/bin"} <= set(env["PATH"].split(":"))
    assert "OBJC_DISABLE_INITIALIZE_FORK_SAFETY" not in env
    assert b"<key>OBJC_DISABLE_INITIALIZE_FORK_SAFETY</key>" not in data
    assert set(plist) == set(launchd.KEY_TYPES)
    assert launchd.validate(data) == plist


def test_plist_round_trips(config: Path, home: Path):
    plist = built(config, home)
    parsed = plistlib.loads(launchd.dumps(plist))
    assert parsed == plist
    assert plistlib.loads(plistlib.dumps(parsed)) == parsed
    assert plistlib.loads(plistlib.dumps(parsed, fmt=plistlib.FMT_BINARY)) == parsed


def test_exit_timeout_follows_the_graceful_shutdown_with_a_margin(config: Path, home: Path):
    for shutdown in (0.5, 1, 2.5, 10, 15, 19):
        exit_timeout = built(config, home, shutdown_timeout_s=shutdown)["ExitTimeOut"]
        # launchd takes whole seconds; SIGKILL must never come before the graceful stop could end.
        assert isinstance(exit_timeout, int)
        assert shutdown + supervision.SHUTDOWN_MARGIN_S <= exit_timeout < shutdown + supervision.SHUTDOWN_MARGIN_S + 1
        assert exit_timeout <= supervision.MAX_STOP_TIMEOUT_S


def test_install_takes_exit_timeout_from_the_config(tmp_path: Path, tiny_model: Path, home: Path, tools):
    config = make_project(tmp_path / "slow", tiny_model, shutdown_timeout_s=12.5)
    assert service("install", "-c", str(config)) == 0
    assert plistlib.loads(launchd.plist_path(home).read_bytes())["ExitTimeOut"] == 18


def test_without_an_entry_point_beside_the_interpreter_it_runs_python_m_depthwatch(config: Path, home: Path, tmp_path: Path):
    bin_dir = tmp_path / "python" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python3"
    python.symlink_to(sys.executable)
    plist = built(config, home, executable=str(python))
    # Not resolved through the symlink: a virtualenv's python is one.
    assert plist["ProgramArguments"] == [str(python), "-m", "depthwatch", "run", "-c", str(config)]
    assert plist["EnvironmentVariables"]["PATH"].split(":")[0] == str(bin_dir)


def test_log_folder_is_where_paths_puts_the_macos_logs(home: Path):
    assert launchd.log_dir(Path.home()) == paths.log_dir("darwin")


def test_validate_names_what_is_wrong(config: Path, home: Path):
    launchd.log_dir(home).mkdir(parents=True)
    good = built(config, home)
    cases = {
        "ThrottleInterval must be int": {**good, "ThrottleInterval": True},
        "ExitTimeOut is missing": {k: v for k, v in good.items() if k != "ExitTimeOut"},
        "not an absolute path to an executable": {**good, "ProgramArguments": ["depthwatch", "run", "-c", str(config)]},
        "OBJC_DISABLE_INITIALIZE_FORK_SAFETY must not be set": {
            **good,
            "EnvironmentVariables": {**good["EnvironmentVariables"], "OBJC_DISABLE_INITIALIZE_FORK_SAFETY": "YES"},
        },
        "SuccessfulExit false": {**good, "KeepAlive": {"SuccessfulExit": True}},
        "ProcessType must be Interactive": {**good, "ProcessType": "Background"},
        "existing config": {**good, "ProgramArguments": [ENTRY_POINT, "run", "-c", str(config.parent / "gone.yaml")]},
        "not in an existing folder": {**good, "StandardErrorPath": str(home / "nowhere" / "depthwatch.log")},
        "must set DEPTHWATCH_LOG_FILE": {
            **good, "EnvironmentVariables": {k: v for k, v in good["EnvironmentVariables"].items() if k != "DEPTHWATCH_LOG_FILE"},
        },
    }
    for expected, plist in cases.items():
        with pytest.raises(DepthwatchError, match=expected):
            launchd.validate(plistlib.dumps(plist))
    with pytest.raises(DepthwatchError, match="does not parse"):
        launchd.validate(b"<plist><dict><key>Label</key></plist>")


def render_template(values: dict[str, str]) -> bytes:
    text = TEMPLATE.read_text()
    for name, value in values.items():
        text = text.replace(f"@{name}@", xml.sax.saxutils.escape(value))
    return text.encode()


def test_the_template_in_launchd_folder_is_the_plist_the_package_builds(tmp_path: Path, tiny_model: Path, home: Path, monkeypatch):
    for name in supervision.PINNED:  # the template is for a shell that sets none (its own variables go in as they are)
        monkeypatch.delenv(name, raising=False)
    # An awkward folder name: the values must be escaped, not pasted.
    config = make_project(tmp_path / "R&D <frames>", tiny_model, shutdown_timeout_s=7)
    plist = built(config, home, shutdown_timeout_s=7)
    rendered = render_template(
        {
            "DEPTHWATCH": ENTRY_POINT,
            "CONFIG": str(config),
            "CONFIG_DIR": str(config.parent),
            "PATH_DIRS": plist["EnvironmentVariables"]["PATH"],
            "EXIT_TIMEOUT": "12",
            "HOME": str(home),
        }
    )
    assert re.search(rb"@[A-Z_]+@", rendered) is None, "a placeholder was left"
    assert list(plistlib.loads(rendered).items()) == list(plist.items())
    comments = TEMPLATE.read_text().split("-->")[0]
    assert "No OBJC_DISABLE_INITIALIZE_FORK_SAFETY" in comments and "never forks" in comments
    assert "No OBJC_DISABLE_INITIALIZE_FORK_SAFETY" in launchd.dumps(plist).decode()


def test_an_installed_package_builds_the_plist_from_its_own_files(tmp_path: Path, config: Path, home: Path):
    """No repository around it (a non-editable `pip install .`): only the package's own files."""
    site = tmp_path / "site"
    shutil.copytree(REPO / "depthwatch", site / "depthwatch", ignore=shutil.ignore_patterns("__pycache__"))
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; import depthwatch.service.launchd as l; "
        "assert l.__file__.startswith(sys.argv[1]), l.__file__; "
        "sys.stdout.buffer.write(l.dumps(l.build(Path(sys.argv[2]), home=Path(sys.argv[3]), shutdown_timeout_s=10)))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", script, str(site), str(config), str(home)],
        cwd=tmp_path,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    assert plistlib.loads(out) == built(config, home)


# -- reading launchctl print --------------------------------------------------------------


def test_parse_print_reads_the_services_own_fields():
    state = launchd.parse_print(RUNNING.format(uid=UID, pid=4242))
    assert (state.loaded, state.running, state.pid, state.last_exit, state.detail) == (True, True, 4242, None, "running")
    state = launchd.parse_print(STOPPED.format(uid=UID, code="78: EX_CONFIG"))
    assert (state.running, state.pid, state.last_exit) == (False, None, 78)
    assert launchd.parse_print("\tstate = not running\n\tlast terminating signal = Segmentation fault: 11\n").last_signal == 11
    assert launchd.parse_print("", loaded=False).loaded is False


# -- the verbs' command lines -------------------------------------------------------------


def test_install_then_uninstall_run_launchctl_and_leave_the_folder_as_found(config: Path, home: Path, tools, capsys):
    agents = launchd.agents_dir(home)
    agents.mkdir(parents=True)
    (agents / "com.example.other.plist").write_bytes(plistlib.dumps({"Label": "com.example.other"}))
    before = folder_snapshot(agents)
    plist_file = agents / "com.depthwatch.agent.plist"

    assert service("install", "-c", str(config)) == 0
    assert tools.calls() == [
        ["launchctl", "print", TARGET],
        ["plutil", "-lint", str(plist_file)],
        ["launchctl", "enable", TARGET],
        ["launchctl", "bootstrap", f"gui/{UID}", str(plist_file)],
    ]
    assert sorted(p.name for p in agents.iterdir()) == ["com.depthwatch.agent.plist", "com.example.other.plist"]
    assert plistlib.loads(plist_file.read_bytes()) == built(config, home)
    assert launchd.log_dir(home).is_dir()
    assert folder_snapshot(agents)["com.example.other.plist"] == before["com.example.other.plist"]
    assert "installed" in capsys.readouterr().out

    tools.clear()
    tools.reply("launchctl print", running(), NOT_LOADED)
    assert service("uninstall") == 0
    assert tools.calls() == [["launchctl", "print", TARGET], ["launchctl", "bootout", TARGET], ["launchctl", "print", TARGET]]
    assert folder_snapshot(agents) == before
    assert launchd.log_dir(home).is_dir(), "the logs stay"


def test_install_again_boots_the_old_agent_out_first(config: Path, home: Path, tools):
    assert service("install", "-c", str(config)) == 0
    tools.clear()
    tools.reply("launchctl print", running(), NOT_LOADED)
    assert service("install", "-c", str(config)) == 0
    plist_file = str(launchd.plist_path(home))
    assert tools.calls() == [
        ["launchctl", "print", TARGET],
        ["launchctl", "bootout", TARGET],
        ["launchctl", "print", TARGET],
        ["plutil", "-lint", plist_file],
        ["launchctl", "enable", TARGET],
        ["launchctl", "bootstrap", f"gui/{UID}", plist_file],
    ]


def test_a_failed_bootstrap_puts_the_folder_back(config: Path, home: Path, tools, capsys):
    agents = launchd.agents_dir(home)
    agents.mkdir(parents=True)
    old = launchd.dumps(built(config, home, shutdown_timeout_s=3))
    launchd.plist_path(home).write_bytes(old)
    before = folder_snapshot(agents)
    tools.reply("launchctl bootstrap", {"rc": 5, "err": "Bootstrap failed: 5: Input/output error\n"})

    assert service("install", "-c", str(config)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Bootstrap failed: 5: Input/output error" in err
    assert {name: data for name, (data, _) in folder_snapshot(agents).items()} == {n: d for n, (d, _) in before.items()}

    launchd.plist_path(home).unlink()
    assert service("install", "-c", str(config)) == 1
    assert list(agents.iterdir()) == []


def test_a_failed_reinstall_loads_the_old_agent_again(config: Path, home: Path, tools, capsys):
    agents = launchd.agents_dir(home)
    agents.mkdir(parents=True)
    old = launchd.dumps(built(config, home, shutdown_timeout_s=3))
    plist_file = launchd.plist_path(home)
    plist_file.write_bytes(old)
    tools.reply("launchctl print", running(), NOT_LOADED)
    tools.reply("launchctl bootstrap", {"rc": 5, "err": "Bootstrap failed: 5: Input/output error\n"}, {"rc": 0})

    assert service("install", "-c", str(config)) == 1
    assert plist_file.read_bytes() == old
    bootstrap = ["launchctl", "bootstrap", f"gui/{UID}", str(plist_file)]
    assert tools.calls()[-2:] == [bootstrap, bootstrap]


@pytest.mark.parametrize(
    ("breakage", "message"),
    [("model", "does not exist"), ("yaml", "not valid YAML")],
)
def test_install_refuses_a_config_the_daemon_could_not_start_with(config: Path, home: Path, tools, capsys, breakage, message):
    if breakage == "model":
        (config.parent.parent / "tiny.onnx").unlink()
    else:
        config.write_text("model: [\n")
    assert service("install", "-c", str(config)) == EX_CONFIG
    assert message in capsys.readouterr().err
    assert tools.calls() == []
    assert not launchd.plist_path(home).exists()


def test_install_checks_the_config_as_the_service_will_see_it_without_the_shells_variables(
    config: Path, home: Path, tools, capsys, monkeypatch
):
    """A watch folder under $SHOTS, set in the shell: install refuses it (exit 78, one line, nothing
    installed), since the daemon, started without the shell's variables, would exit 78 at every start
    and be restarted for good while install said "installed and started"."""
    monkeypatch.setenv("SHOTS", str(config.parent))
    text = config.read_text().replace("- frames", "- $SHOTS/frames")
    assert "$SHOTS" in text
    config.write_text(text)
    assert service("install", "-c", str(config)) == EX_CONFIG
    err = capsys.readouterr().err
    assert "watch.folders uses $SHOTS, which is not set here (a service starts without your shell's variables)" in err
    assert tools.calls() == [] and not launchd.plist_path(home).exists()
    assert os.environ["SHOTS"] == str(config.parent)  # the shell's own variables are back


def test_the_xdg_folders_of_the_installing_shell_go_into_the_service(config: Path, home: Path, monkeypatch):
    """The shell's absolute $XDG_DATA_HOME and $XDG_STATE_HOME go into the service, so a model fetched
    under them is installed for it too, and its status goes where `depthwatch status` in that shell looks."""
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # not absolute: ignored, as the XDG spec says
    env = built(config, home)["EnvironmentVariables"]
    assert env["XDG_DATA_HOME"] == str(home / "data") and env["XDG_STATE_HOME"] == str(home / "state")
    assert "XDG_CACHE_HOME" not in env


def test_install_without_a_config_writes_the_documented_one_and_installs_with_it(
    home: Path, tiny_model: Path, tools, capsys, monkeypatch
):
    user_config = new_user(home, monkeypatch, fetched=True)
    assert service("install") == 0
    out = capsys.readouterr().out
    assert user_config.read_bytes() == DOCUMENTED_CONFIG.read_bytes()
    assert out.splitlines()[-1] == (
        f"config: wrote the documented default to {user_config}; edit it (watch.folders, model.path) "
        "and run `depthwatch service install` again"
    )
    plist = plistlib.loads(launchd.plist_path(home).read_bytes())
    assert plist["ProgramArguments"][-2:] == ["-c", str(user_config)]
    assert plist["WorkingDirectory"] == str(user_config.parent)
    assert tools.calls()[-1] == ["launchctl", "bootstrap", f"gui/{UID}", str(launchd.plist_path(home))]

    user_config.write_text("# mine\n" + user_config.read_text())
    edited = user_config.read_bytes()
    assert service("install") == 0
    assert user_config.read_bytes() == edited
    assert "wrote" not in capsys.readouterr().out


def test_install_without_a_config_or_its_model_says_what_to_do_and_writes_nothing(home: Path, tools, capsys, monkeypatch):
    new_user(home, monkeypatch)
    assert service("install") == EX_CONFIG
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "`depthwatch models fetch midas-v21-small`" in err and "offline, put the model file where the README says" in err and "and pass -c CONFIG" in err
    assert tree(home) == {}
    assert tools.calls() == []


def test_a_failed_first_install_takes_back_the_config_and_folders_it_made(home: Path, tiny_model: Path, tools, capsys, monkeypatch):
    new_user(home, monkeypatch, fetched=True)
    before = tree(home)
    tools.reply("launchctl bootstrap", {"rc": 125, "err": "Bootstrap failed: 125: Domain does not support specified action\n"})
    assert service("install") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "logged in at the Mac's screen" in err
    assert tree(home) == before, "no plist, no log or agents folder, no config"


def test_print_without_a_config_shows_what_install_would_write(home: Path, tiny_model: Path, tools, capsys, monkeypatch):
    user_config = new_user(home, monkeypatch, fetched=True)
    before = tree(home)
    assert service("print") == 0
    printed = capsys.readouterr()
    assert printed.err == f"depthwatch: no config yet: install writes the documented default to {user_config}\n"
    assert tree(home) == before
    assert service("install") == 0
    assert launchd.plist_path(home).read_text() == printed.out


def install_plist(config: Path, home: Path) -> None:
    launchd.log_dir(home).mkdir(parents=True, exist_ok=True)
    launchd.plist_path(home).parent.mkdir(parents=True, exist_ok=True)
    launchd.plist_path(home).write_bytes(launchd.dumps(built(config, home)))


def test_start_stop_restart_run_the_right_launchctl_lines(config: Path, home: Path, tools, capsys):
    install_plist(config, home)

    tools.reply("launchctl print", stopped())
    assert service("start") == 0
    assert tools.calls() == [["launchctl", "print", TARGET], ["launchctl", "kickstart", TARGET]]

    tools.clear()
    tools.reply("launchctl print", NOT_LOADED)
    assert service("start") == 0
    plist_file = str(launchd.plist_path(home))
    assert tools.calls() == [["launchctl", "print", TARGET], ["launchctl", "bootstrap", f"gui/{UID}", plist_file]]

    tools.clear()
    tools.reply("launchctl print", running(), stopped("0"))
    assert service("stop") == 0
    assert tools.calls() == [
        ["launchctl", "print", TARGET],
        ["launchctl", "kill", "SIGTERM", TARGET],
        ["launchctl", "print", TARGET],
    ]
    assert "stopped com.depthwatch.agent (exit status 0 (a clean stop))" in capsys.readouterr().out

    tools.clear()
    tools.reply("launchctl print", stopped())
    assert service("stop") == 0
    assert tools.calls() == [["launchctl", "print", TARGET]]
    assert "is not running" in capsys.readouterr().out

    tools.clear()
    tools.reply("launchctl print", running())
    assert service("restart") == 0
    assert tools.calls() == [["launchctl", "print", TARGET], ["launchctl", "kickstart", "-k", TARGET]]


def test_verbs_on_a_service_that_is_not_installed_say_so(home: Path, tools, capsys):
    for verb in ("start", "stop", "restart"):
        assert service(verb) == 1
        assert "not installed" in capsys.readouterr().err
    assert service("uninstall") == 0
    assert "not installed; nothing to do" in capsys.readouterr().out
    assert tools.calls() == [["launchctl", "print", TARGET]]


def test_status_reports_launchd_and_the_daemons_status_file(config: Path, home: Path, tools, capsys):
    install_plist(config, home)
    pid = os.getpid()  # a process that is there: the status file's daemon is checked, not taken at its word
    status = Status(pid=pid, state="running", model="tiny.onnx", providers=["CPUExecutionProvider"])
    status.counts.done = 7
    write_status(config.parent / "status.json", status)

    tools.reply("launchctl print", running(pid))
    assert service("status") == 0
    out = capsys.readouterr().out
    assert tools.calls() == [["launchctl", "print", TARGET]]
    assert f"running:     yes, pid {pid} (running)" in out
    assert f"daemon:      running, pid {pid}, updated" in out
    assert f"config:      {config}" in out
    assert "7 done, 0 failed" in out and "(from an earlier run)" not in out

    tools.reply("launchctl print", stopped("78: EX_CONFIG"))
    assert service("status") == 3
    out = capsys.readouterr().out
    assert "running:     no (not running)" in out
    assert "last exit:   78 (EX_CONFIG: a bad config or a missing model" in out

    tools.reply("launchctl print", NOT_LOADED)
    assert service("status") == 3
    assert "loaded:      no" in capsys.readouterr().out


def test_logs_shows_the_end_of_the_log(home: Path, tools, capsys):
    log = launchd.log_path(home)
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"line {i}\n" for i in range(1000)))
    launchd.stdout_path(home).write_text("")
    assert service("logs", "-n", "3") == 0
    assert capsys.readouterr().out == "line 997\nline 998\nline 999\n"

    launchd.stdout_path(home).write_text("printed\n")
    assert service("logs", "-n", "1") == 0
    out = capsys.readouterr().out
    assert f"==> {log} <==\nline 999\n" in out and f"==> {launchd.stdout_path(home)} <==\nprinted\n" in out
    assert tools.calls() == []


def test_logs_without_a_log_says_so(home: Path, tools, capsys):
    assert service("logs") == 1
    assert "no log yet" in capsys.readouterr().err


def test_logs_of_an_empty_log_say_so(home: Path, tools, capsys):
    log = launchd.log_path(home)
    log.parent.mkdir(parents=True)
    log.write_text("")
    launchd.stdout_path(home).write_text("")
    assert service("logs") == 0
    assert capsys.readouterr() == ("", f"depthwatch: the log is empty: the daemon has written nothing to {log} yet\n")


@pytest.mark.parametrize("sigint", ["as inherited", "ignored"])
def test_logs_follow_prints_new_lines_until_interrupted(home: Path, tmp_path: Path, sigint: str):
    """Ctrl-C ends it, even when it was started with SIGINT ignored: what a program started in the
    background by a non-interactive shell inherits (a CI runner's suite, `cmd &` in a script), and
    then Python installs no KeyboardInterrupt of its own: left at that, it would never exit."""
    log = launchd.log_path(home)
    log.parent.mkdir(parents=True)
    log.write_text("old\n")
    env = {**os.environ, "HOME": str(home)}
    argv = [sys.executable, "-m", "depthwatch", "service", "logs", "-f", "-n", "1", "--manager", "launchd"]
    if sigint == "ignored":  # `trap '' INT` ignores it, and exec keeps it ignored
        argv = ["/bin/sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert read_line(proc) == "old"
        with open(log, "a") as f:
            f.write("new\n")
        assert read_line(proc) == "new"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        kill_quietly(proc)
        proc.stdout.close()
        proc.stderr.close()


def read_line(proc: subprocess.Popen[bytes], timeout: float = 30) -> str:
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        assert sel.select(timeout), "no output in time"
    return proc.stdout.readline().decode().rstrip("\n")


def test_print_shows_the_plist_without_installing(config: Path, home: Path, tools, capsys):
    assert service("print", "-c", str(config)) == 0
    assert plistlib.loads(capsys.readouterr().out.encode()) == built(config, home)
    assert not launchd.agents_dir(home).exists()
    assert tools.calls() == []


# -- the daemon, started the way the plist starts it --------------------------------------


def start_from_plist(plist: dict) -> subprocess.Popen[bytes]:
    return start_like_supervisor(
        plist["ProgramArguments"],
        cwd=plist["WorkingDirectory"],
        env=supervisor_env(Path(plist["StandardErrorPath"]).parents[3], plist["EnvironmentVariables"]),
        stdout=Path(plist["StandardOutPath"]),
        stderr=Path(plist["StandardErrorPath"]),
    )


def test_the_daemon_started_as_the_plist_says_processes_a_frame_and_stops_on_sigterm(config: Path, home: Path, tools, capsys):
    assert service("install", "-c", str(config)) == 0
    plist = plistlib.loads(launchd.plist_path(home).read_bytes())
    log = Path(plist["EnvironmentVariables"]["DEPTHWATCH_LOG_FILE"])
    proc = start_from_plist(plist)
    try:
        wait_running(proc, config.parent / "status.json", log)
        output = process_one_frame(proc, config.parent / "frames", log)
        assert output.stat().st_size > 0

        # The daemon rewrites its status file a moment after the depth map lands.
        status_file = config.parent / "status.json"
        wait_for(lambda: read_status(status_file)["counts"]["done"] == 1, what="the status file to count the frame")
        capsys.readouterr()
        tools.reply("launchctl print", running(proc.pid))
        assert service("status") == 0
        out = capsys.readouterr().out
        assert f"pid {proc.pid}" in out and "1 done, 0 failed" in out

        code, seconds = stop_with_sigterm(proc, plist["ExitTimeOut"])
    finally:
        kill_quietly(proc)
    assert code == 0, log.read_text()
    assert seconds < plist["ExitTimeOut"]
    text = log.read_text()
    assert "ready: watching 1 folder(s)" in text and text.rstrip().endswith("stopped")
    assert "Traceback" not in text


@pytest.mark.parametrize("breakage", ["missing model", "bad config"])
def test_a_startup_error_exits_78_with_a_one_line_reason_as_the_logs_last_line(config: Path, home: Path, breakage: str):
    launchd.log_dir(home).mkdir(parents=True)
    plist = built(config, home)
    launchd.validate(launchd.dumps(plist))
    if breakage == "missing model":
        (config.parent.parent / "tiny.onnx").unlink()
        expected = "depthwatch: model file "
    else:
        data = yaml.safe_load(config.read_text())
        data["daemon"]["workerz"] = 3
        config.write_text(yaml.safe_dump(data))
        expected = f"depthwatch: {config}:"
    log = Path(plist["EnvironmentVariables"]["DEPTHWATCH_LOG_FILE"])
    proc = start_from_plist(plist)
    try:
        assert wait_exit(proc) == EX_CONFIG
    finally:
        kill_quietly(proc)
    lines = log.read_text().splitlines()
    assert lines and " ERROR   " in lines[-1] and lines[-1].split(" ERROR   ", 1)[1].startswith(expected), lines
    assert "Traceback" not in log.read_text()
    assert Path(plist["StandardErrorPath"]).read_text().splitlines()[-1].startswith(expected)  # and on stderr, as ever


def test_the_daemon_started_as_the_plist_says_rotates_its_own_log(config: Path, home: Path):
    """launchd holds StandardErrorPath open for good, so the log the daemon writes is its own file, rotated."""
    from depthwatch.service import logfiles

    launchd.log_dir(home).mkdir(parents=True)
    plist = built(config, home)
    log = Path(plist["EnvironmentVariables"]["DEPTHWATCH_LOG_FILE"])
    with open(log, "wb") as f:  # a log a long run left just under the limit (sparse: no disk needed)
        f.truncate(logfiles.ROTATE_BYTES - 10)
    proc = start_from_plist(plist)
    try:
        wait_running(proc, config.parent / "status.json", log)
        process_one_frame(proc, config.parent / "frames", log)
        code, _ = stop_with_sigterm(proc, plist["ExitTimeOut"])
    finally:
        kill_quietly(proc)
    assert code == 0
    older = log.with_name(log.name + ".1")
    assert older.stat().st_size == logfiles.ROTATE_BYTES - 10  # the full one, moved aside whole
    text = log.read_text()
    assert text.startswith(text.splitlines()[0]) and "\0" not in text  # a fresh file
    assert "ready: watching 1 folder(s)" in text and "frame.jpg -> depth.jpg" in text and text.rstrip().endswith("stopped")
    assert log.stat().st_size < logfiles.ROTATE_BYTES
    assert " INFO " not in Path(plist["StandardErrorPath"]).read_text()  # the log lines went to the log only
