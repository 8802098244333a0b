"""config.yaml: documented defaults in step with the code, strict errors with line numbers, discovery."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from depthwatch import config as configuration
from depthwatch import paths
from depthwatch.errors import EX_CONFIG, ConfigError

REPO = Path(__file__).resolve().parents[1]

BAD_CONFIGS = {
    "yaml syntax": ("model:\n  path: [unclosed\n", ":3:1: not valid YAML"),
    "tab indentation": ("model:\n\tpath: x\n", ":2:1: not valid YAML: found character '\\t'"),
    "python tag": ("model: !!python/object:os.system {}\n", ":1:8: not valid YAML: could not determine a constructor"),
    "duplicate key": ("model:\n  path: a.onnx\n  path: b.onnx\n", ":3:3: 'path' is set twice"),
    "unknown section": ("modle:\n  path: a.onnx\n", ":1:1: unknown section 'modle' (did you mean 'model'?)"),
    "unknown setting": ("watch:\n  patern: '*.jpg'\n", ":2:3: unknown setting watch.patern (did you mean 'patterns'?)"),
    "top level list": ("- model\n- watch\n", ":1:1: the config must be a mapping of sections"),
    "section not a mapping": ("watch: [tmp]\n", ":1:8: section 'watch' must be a mapping of settings"),
    "wrong type": ("watch:\n  recursive: yes please\n", ":2:14: watch.recursive must be true or false, not 'yes please'"),
    "out of range": ("output:\n  jpeg_quality: 500\n", ":2:17: output.jpeg_quality must be between 1 and 100, not 500"),
    "zero workers": ("daemon:\n  workers: 0\n", ":2:12: daemon.workers must be between 1 and 64, not 0"),
    "float for int": ("daemon:\n  retries: 2.5\n", ":2:12: daemon.retries must be a whole number, not float 2.5"),
    "unknown provider": ("model:\n  providers: [cudaa]\n", ":2:14: model.providers 'cudaa' is not a provider; use auto or a list of coreml, cuda, openvino, cpu (did you mean 'cuda'?)"),
    "empty providers": ("model:\n  providers: []\n", ":2:14: model.providers must list at least one entry"),
    "unknown profile": ("model:\n  profile: midas-small\n", ":2:12: model.profile must be one of auto,"),
    "bad choice": ("watch:\n  observer: poling\n", ":2:13: watch.observer must be one of native, polling, not 'poling' (did you mean 'polling'?)"),
    "png bits": ("output:\n  png_bits: 12\n", ":2:13: output.png_bits must be one of 8, 16, 32, not int 12"),
    "template field": ("output:\n  template: '{frame}.jpg'\n", ":2:13: output.template '{frame}.jpg' uses an unknown field 'frame'"),
    "template format": ("output:\n  template: depth.gif\n", ":2:13: output.template 'depth.gif' must end in .jpg, .png, .tif or .exr"),
    "template escapes": ("output:\n  template: ../depth.jpg\n", ":2:13: output.template '../depth.jpg' climbs out of the watch folder"),
    "missing folder": ("watch:\n  folders: [/nonexistent/volume/frames]\n", ":2:12: watch.folders /nonexistent/volume/frames does not exist, nor does its parent"),
    "folder is a file": ("watch:\n  folders: [config.yaml]\n", "is a file, not a folder"),
    "clip order": ("output:\n  clip_percent: [98, 2]\n", ":2:17: output.clip_percent low (98) must be below high (2)"),
    "refine choice": ("output:\n  refine: edge\n", ":2:11: output.refine must be one of edges, none, not 'edge' (did you mean 'edges'?)"),
    "level range": ("output:\n  near: 1.5\n", ":2:9: output.near must be a fraction between 0 and 1 (or a percentile like '80%'), not 1.5"),
    "level percent": ("output:\n  far: 120%\n", ":2:8: output.far must be a percentile between 0% and 100%, not '120%'"),
    "level words": ("output:\n  far: black\n", ":2:8: output.far must be a fraction 0..1 or a percentile like '80%', not 'black'"),
    "gamma range": ("output:\n  gamma: 0\n", ":2:10: output.gamma must be between 0.1 and 10, not 0"),
    "near below far": ("output:\n  near: 0.2\n  far: 0.5\n", ":1:1: output.near (0.2) must be above output.far (0.5); to make near black, set output.invert: true"),
    "float png": ("output:\n  template: depth.png\n  png_bits: 32\n", ":1:1: output.png_bits 32 (float) needs a .tif or .exr template"),
    "mean without std": ("model:\n  mean: [0.5, 0.5, 0.5]\n", ":1:1: model.mean and model.std go together"),
    "ext webp": (
        "watch:\n  patterns: ['*.webp', '*.jpg']\noutput:\n  template: '{stem}_depth.{ext}'\n",
        ":1:1: output.template '{stem}_depth.{ext}' names the map after a *.webp frame's extension, and depth maps cannot be written as .webp",
    ),
    "ext png 32": (
        "watch:\n  patterns: ['*.PNG']\noutput:\n  template: '{stem}_depth.{ext}'\n  png_bits: 32\n",
        ":1:1: output.png_bits 32 (float) needs .tif or .exr maps, and output.template '{stem}_depth.{ext}' makes a *.PNG frame's map a PNG",
    ),
    "output is input": ("watch:\n  patterns: [frame.jpg]\noutput:\n  template: frame.jpg\n", "output.template 'frame.jpg' is also a watch pattern"),
    # A save cut short leaves NULs: one line, not a traceback that ends a running daemon at its reload.
    "control character": ("watch:\n  patterns: ['*.jpg']\n\x00\n", ":3:1: a control character (#x0000) YAML does not allow; remove it"),
    "not utf-8": ("output:\n  template: 'd\xe9.jpg'\n".encode("latin-1"), ":2:15: not UTF-8 text (byte 0xe9); save the file as UTF-8"),
    "two documents": ("watch: {}\n---\noutput: {}\n", ":2:1: not valid YAML: expected a single document in the stream but found another document"),
    # YAML 1.1 reads these as other numbers than the ones written: said, not taken without a word.
    "padded frame number": ("output:\n  first_frame: 01001\n", ":2:16: output.first_frame is written 01001, which YAML reads as 513 (octal)"),
    "base 60": ("watch:\n  settle_ms: 2:30\n", ":2:14: watch.settle_ms is written 2:30, which YAML reads as 150 (base 60)"),
    "word read as false": ("output:\n  refine: no\n", ':2:11: output.refine must be one of edges, none, not bool False (YAML reads no as false: write "no" in quotes'),
    # A service starts without the shell's variables: no folder named `$SHOTS` is made and watched.
    "unset variable": ("watch:\n  folders: [$DEPTHWATCH_UNSET_IN_TESTS/frames]\n", ":2:12: watch.folders uses $DEPTHWATCH_UNSET_IN_TESTS, which is not set here"),
    "unset variable in model": ("model:\n  path: ${DEPTHWATCH_UNSET_IN_TESTS}/m.onnx\n", ":2:9: model.path uses $DEPTHWATCH_UNSET_IN_TESTS, which is not set"),
    "status file folder": ("daemon:\n  status_file: nowhere/status.json\n", "/nowhere does not exist; create it or fix the path"),
}


@pytest.mark.parametrize("case", BAD_CONFIGS)
def test_bad_config_is_one_line_with_its_place_and_exit_78(tmp_path, case):
    text, expected = BAD_CONFIGS[case]
    path = tmp_path / "config.yaml"
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "depthwatch", "run", "-c", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == EX_CONFIG, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"depthwatch: {path}:")
    assert expected in lines[0], lines[0]


def test_repository_config_documents_every_default(tmp_path):
    """config.yaml and the code's defaults are the same, key for key, value for value."""
    text = (REPO / "config.yaml").read_text()
    documented = yaml.safe_load(text)
    assert documented == configuration.dump_defaults()
    parsed = configuration.parse(text, tmp_path / "config.yaml")
    assert parsed.model == configuration.Config().model
    assert parsed.watch.folders == (tmp_path / "tmp",)
    for values in documented.values():
        for key in values:
            assert f"\n  {key}:" in text  # every key written out, with its comment above it


def test_paths_are_taken_from_the_config_folder_with_home_and_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOTS", str(tmp_path / "srv"))
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "srv").mkdir()
    text = "watch:\n  folders: [frames, ~/inbox, $SHOTS/today]\nmodel:\n  path: ../models/m.onnx\n"
    folder = tmp_path / "cfg"
    folder.mkdir()
    (tmp_path / "inbox").mkdir()
    config = configuration.parse(text, folder / "config.yaml")
    assert config.watch.folders == (folder / "frames", tmp_path / "inbox", tmp_path / "srv" / "today")
    assert config.base == folder


def test_discovery_order(tmp_path, monkeypatch):
    explicit, env, user = (tmp_path / n for n in ("explicit.yaml", "env.yaml", "xdg"))
    explicit.write_text("")
    env.write_text("")
    (user / "depthwatch").mkdir(parents=True)
    (user / "depthwatch" / "config.yaml").write_text("")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(user))
    monkeypatch.setenv(configuration.ENV_VAR, str(env))
    assert configuration.find(str(explicit), platform="linux") == explicit
    assert configuration.find(None, platform="linux") == env
    monkeypatch.delenv(configuration.ENV_VAR)
    assert configuration.find(None, platform="linux") == user / "depthwatch" / "config.yaml"
    (user / "depthwatch" / "config.yaml").unlink()
    assert configuration.find(None, platform="linux") is None  # built-in defaults
    with pytest.raises(ConfigError, match="does not exist; check the -c path"):
        configuration.find(str(tmp_path / "nope.yaml"))
    monkeypatch.setenv(configuration.ENV_VAR, str(tmp_path / "gone.yaml"))
    with pytest.raises(ConfigError, match=r"\$DEPTHWATCH_CONFIG names .* which does not exist"):
        configuration.find(None)


def test_macos_config_lives_in_application_support(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)  # platformdirs honours them on macOS too
    assert paths.default_config_file("darwin") == tmp_path / "Library/Application Support/depthwatch/config.yaml"
    assert paths.models_dir("darwin") == tmp_path / "Library/Application Support/depthwatch/models"
    assert paths.log_dir("darwin") == tmp_path / "Library/Logs/depthwatch"


def test_check_command_validates_loads_and_runs_a_frame(tmp_path, tiny_model):
    path = tmp_path / "config.yaml"
    path.write_text(f"model:\n  path: {tiny_model}\n  profile: midas-v21-small\n")
    done = subprocess.run([sys.executable, "-m", "depthwatch", "check", "-c", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "providers: CPUExecutionProvider" in done.stdout
    assert "contract:  input 'image' float32 NCHW 32x32 -> output 'depth' [1x32x32]" in done.stdout
    assert done.stdout.strip().endswith("ok")
    # What `run` does with the same config, check says too: a pattern/template clash is warned about,
    # and daemon.max_megapixels is for editors' frames, not check's own 1080p one (not "1920x1080
    # is 2 megapixels, over the limit of 2", exit 1, for a config that runs).
    path.write_text(
        f"model:\n  path: {tiny_model}\n  profile: midas-v21-small\ndaemon:\n  max_megapixels: 2\n"
        "watch:\n  patterns: ['*_depth.jpg', '*.jpg']\noutput:\n  template: '{stem}_depth.jpg'\n"
    )
    done = subprocess.run([sys.executable, "-m", "depthwatch", "check", "-c", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning:   watch.patterns *_depth.jpg and output.template {stem}_depth.jpg clash" in done.stdout
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    path.write_text(f"model:\n  path: {tmp_path / 'broken.onnx'}\n")
    done = subprocess.run([sys.executable, "-m", "depthwatch", "check", "-c", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == EX_CONFIG
    # One line, the last (an info line may say that the engines were being measured first).
    assert done.stderr.strip().splitlines()[-1].startswith(f"depthwatch: cannot load model {tmp_path / 'broken.onnx'}:")


@pytest.mark.parametrize("how", ["user config folder", "-c", "$DEPTHWATCH_CONFIG"])
def test_a_config_folder_the_user_cannot_search_is_one_line_and_exit_78(tmp_path, how):
    """As the user (root loses the capabilities that read anything): no traceback, the folder named."""
    from daemon_process import privileges

    xdg = tmp_path / "xdg"
    (xdg / "depthwatch").mkdir(parents=True)
    config = xdg / "depthwatch" / "config.yaml"
    config.write_text("watch:\n  folders: [frames]\n")
    env = {k: v for k, v in os.environ.items() if k != configuration.ENV_VAR}
    env["XDG_CONFIG_HOME"] = str(xdg)
    args = []
    if how == "-c":
        args = ["-c", str(config)]
    elif how == "$DEPTHWATCH_CONFIG":
        env[configuration.ENV_VAR] = str(config)
    xdg.chmod(0)
    try:
        done = subprocess.run(
            [*privileges(True), sys.executable, "-m", "depthwatch", "run", *args],
            capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env, check=False,
        )
    finally:
        xdg.chmod(0o700)
    assert done.returncode == EX_CONFIG, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    instead = "$DEPTHWATCH_CONFIG" if how == "$DEPTHWATCH_CONFIG" else "-c CONFIG"
    expected = (
        f"depthwatch: cannot look for the config file {config}: permission denied on the folder {xdg}; "
        f"give yourself access to it (chmod u+rx {xdg}) or name a config with {instead}"
    )
    assert lines == [expected], done.stderr


def test_the_old_name_of_range_percentile_still_works_and_says_so(tmp_path, caplog):
    """output.clip_percent, the old name of output.range_percentile (beside output.clip_template it reads as a
    setting of video clips), is still read, with one warning line; set beside the new name, it is refused."""
    path = tmp_path / "config.yaml"
    with caplog.at_level("WARNING", logger="depthwatch.config"):
        config = configuration.parse("output:\n  clip_percent: [2, 98]\n", path)
    assert config.output.range_percentile == (2.0, 98.0)
    assert caplog.messages == [
        f"{path}:2:3: output.clip_percent is now called output.range_percentile; "
        "write range_percentile instead (the old name still works, for now)"
    ]
    with pytest.raises(ConfigError, match=r":2:3: output.clip_percent is the old name of output.range_percentile, which is set too"):
        configuration.parse("output:\n  clip_percent: [2, 98]\n  range_percentile: [1, 99]\n", path)


def test_numbers_yaml_reads_as_written_and_a_folder_named_with_a_dollar_are_taken(tmp_path):
    """The refusals of YAML 1.1's other readings (01001, 2:30) and of unset variables stop there:
    05.5 is 5.5, 0 is 0, 0x10 is 16, and a folder literally named `a$NOPE` is that folder."""
    (tmp_path / "a$DEPTHWATCH_UNSET_IN_TESTS").mkdir()
    text = (
        "output:\n  gamma: 02.5\n  first_frame: 0\n  jpeg_quality: 0x50\n"
        "watch:\n  folders: [a$DEPTHWATCH_UNSET_IN_TESTS]\n"
    )
    config = configuration.parse(text, tmp_path / "config.yaml")
    assert (config.output.gamma, config.output.first_frame, config.output.jpeg_quality) == (2.5, 0, 80)
    assert config.watch.folders == (tmp_path / "a$DEPTHWATCH_UNSET_IN_TESTS",)


@pytest.mark.parametrize("how", ["user config folder", "-c"])
def test_a_config_linked_to_dev_zero_is_refused_at_start_in_one_line(tmp_path, how):
    """The config is read bounded, like a frame: a link to /dev/zero is refused with exit 78 before a byte
    is read. In the user's folder it stops the search (going on to ./config.yaml or the built-in
    defaults would watch another folder, without a word)."""
    xdg = tmp_path / "xdg"
    (xdg / "depthwatch").mkdir(parents=True)
    config = xdg / "depthwatch" / "config.yaml"
    config.symlink_to("/dev/zero")
    env = {k: v for k, v in os.environ.items() if k != configuration.ENV_VAR}
    env["XDG_CONFIG_HOME"] = str(xdg)
    args = ["-c", str(config)] if how == "-c" else []
    done = subprocess.run(
        [sys.executable, "-m", "depthwatch", "run", *args],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env, check=False,
    )
    assert done.returncode == EX_CONFIG, done.stderr
    if how == "-c":
        expected = f"config file {config} is a character device, not a file; check the -c path"
    else:
        expected = f"{config} exists but is not a config file: it is a character device, not a file; fix or remove it, or pass -c CONFIG"
    assert done.stderr.splitlines() == [f"depthwatch: {expected}"]
    assert not (tmp_path / "tmp").exists()  # the built-in defaults' watch folder


def test_the_repository_config_points_to_pages_that_exist():
    """A comment in config.yaml that sends the reader elsewhere names a page of docs/ that is there, or a
    section the README has (not 'see README, "HTTP API"' where the README has no such section)."""
    comments = " ".join(
        line.split("#", 1)[1].strip() for line in (REPO / "config.yaml").read_text().splitlines() if line.lstrip().startswith("#")
    )
    pages = re.findall(r"\bdocs/[\w./-]+\.md", comments)
    assert pages, "config.yaml names no page of docs/"
    for page in pages:
        assert (REPO / page).is_file(), page
    headings = {line.lstrip("#").strip() for line in (REPO / "README.md").read_text().splitlines() if line.startswith("#")}
    for mention in re.finditer(r"\bREADME\b(?:, \"([^\"]+)\")?", comments):
        assert mention.group(1) in headings, f"config.yaml sends the reader to {mention.group(0)!r}, which has no such section"
