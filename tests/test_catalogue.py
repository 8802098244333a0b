"""The model catalogue (models/catalogue.yaml): its contents, its packaging, and how names resolve."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from onnx_models import brightness_model

from depthwatch.config import ModelConfig
from depthwatch.errors import ConfigError, ModelError
from depthwatch.model import catalogue
from depthwatch.model.catalogue import Entry
from depthwatch.model.profiles import PROFILES

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _builtin_catalogue_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(catalogue.ENV_VAR, raising=False)


def cli_env(tmp_path: Path) -> dict[str, str]:
    """An environment with a home of its own: no user config, an empty model folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "DEPTHWATCH_"))}
    env.update(HOME=str(tmp_path / "home"), XDG_DATA_HOME=str(tmp_path / "data"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    return env


def default_models_dir(tmp_path: Path) -> Path:
    if sys.platform == "darwin":
        return tmp_path / "home" / "Library" / "Application Support" / "depthwatch" / "models"
    return tmp_path / "data" / "depthwatch" / "models"


# -- what the shipped catalogue says ----------------------------------------------------------


def test_the_catalogue_has_the_supported_models_from_their_official_or_named_sources():
    entries = catalogue.load()

    small, large, anything = entries["midas-v21-small"], entries["midas-v21-large"], entries["depth-anything-v2-small"]
    assert (small.file, PROFILES[small.profile].input_size) == ("model-small.onnx", 256)
    assert (large.file, PROFILES[large.profile].input_size) == ("model-f6b98070.onnx", 384)
    assert (anything.file, PROFILES[anything.profile].input_size) == ("depth_anything_v2_vits.onnx", 518)
    for entry in (small, large):
        assert entry.url == f"https://github.com/isl-org/MiDaS/releases/download/v2_1/{entry.file}"
        assert entry.licence == "MIT"
    assert anything.url.startswith("https://github.com/fabio-sim/Depth-Anything-ONNX/releases/download/")
    assert anything.licence == "Apache-2.0"
    assert "community" in anything.source and "no ONNX" in anything.source


def test_every_entry_is_consistent_with_its_profile_and_carries_no_guessed_numbers():
    for entry in catalogue.load().values():
        # `--model PATH/<file>` with profile auto must pick the same profile as the name does.
        assert entry.file in PROFILES[entry.profile].files, entry.name
        assert entry.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", entry.sha256)
        assert entry.size is None or entry.size > 0
    readme = (REPO / "models" / "README.md").read_text(encoding="utf-8")
    for name in catalogue.load():
        assert f"`{name}`" in readme, f"models/README.md does not describe {name}"


def test_the_default_config_names_a_catalogue_model():
    assert ModelConfig().path in catalogue.load()
    shipped = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    assert shipped["model"]["path"] == ModelConfig().path


def test_the_package_reads_the_catalogue_in_models_through_package_data():
    """depthwatch/model/catalogue.yaml points at models/catalogue.yaml, and is declared package data.

    A wheel build copies the link's target as a real file; a copy of the package
    made the same way (links followed) reads its catalogue without models/.
    """
    link = REPO / "depthwatch" / "model" / "catalogue.yaml"
    assert link.is_symlink() and link.resolve() == (REPO / "models" / "catalogue.yaml").resolve()
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert "model/catalogue.yaml" in pyproject["tool"]["setuptools"]["package-data"]["depthwatch"]


def test_a_copy_of_the_installed_package_finds_its_catalogue(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(REPO / "depthwatch", site / "depthwatch", symlinks=False, ignore=shutil.ignore_patterns("__pycache__"))
    assert not (site / "depthwatch" / "model" / "catalogue.yaml").is_symlink()
    env = {**cli_env(tmp_path), "PYTHONPATH": str(site)}

    done = subprocess.run(
        [sys.executable, "-c", "import depthwatch.model.catalogue as c; print(c.__file__); print(sorted(c.load()))"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60, check=False,
    )

    assert done.returncode == 0, done.stderr
    where, names = done.stdout.splitlines()
    assert where.startswith(str(site))
    assert names == "['depth-anything-v2-small', 'midas-v21-large', 'midas-v21-small']"


# -- reading catalogue files ---------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "catalogue.yaml"
    path.write_text(text, encoding="utf-8")
    return path


GOOD = """\
models:
  studio-depth:
    file: studio.onnx
    url: https://models.example.org/studio.onnx
    profile: dpt-hybrid
    licence: proprietary
"""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("    licence: proprietary\n", "    licence: proprietary\n    checksum: abc\n"), "unknown field 'checksum'"),
        (("studio.onnx\n", "../studio.onnx\n"), "file must be a plain file name ending in .onnx"),
        (("profile: dpt-hybrid", "profile: dpt-huge"), "unknown profile 'dpt-huge'"),
        (("    licence: proprietary\n", "    licence: proprietary\n    sha256: 1234\n"), "sha256 must be 64 hexadecimal digits or null"),
        (("https://models", "ftp://models"), "url must start with https:// or http://"),
        (("    licence: proprietary\n", ""), "licence is missing"),
        (("studio-depth:", "Studio Depth:"), "names are lowercase letters"),
    ],
)
def test_a_wrong_catalogue_entry_is_one_line_naming_the_file_and_entry(tmp_path, change, message):
    path = write(tmp_path, GOOD.replace(*change))
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        catalogue.parse_file(path)
    assert str(caught.value).startswith(f"{path}: model ")
    assert "\n" not in str(caught.value)


def test_an_extra_catalogue_adds_to_and_overrides_the_builtin_one(tmp_path, monkeypatch):
    extra = write(tmp_path, GOOD + "  midas-v21-small:\n    file: model-small.onnx\n    url: http://127.0.0.1:1/m.onnx\n"
                  "    profile: midas-v21-small\n    licence: MIT\n")
    monkeypatch.setenv(catalogue.ENV_VAR, str(extra))

    entries = catalogue.load()

    assert entries["studio-depth"] == Entry(
        name="studio-depth", file="studio.onnx", url="https://models.example.org/studio.onnx",
        profile="dpt-hybrid", licence="proprietary", title="studio-depth",
    )
    assert entries["midas-v21-small"].url == "http://127.0.0.1:1/m.onnx"
    assert "midas-v21-large" in entries


def test_a_missing_extra_catalogue_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setenv(catalogue.ENV_VAR, str(tmp_path / "nowhere.yaml"))
    with pytest.raises(ConfigError, match=r"\$DEPTHWATCH_CATALOGUE names .*nowhere\.yaml, which does not exist"):
        catalogue.load()


# -- names to files and specs --------------------------------------------------------------------


def test_model_file_is_the_entry_file_in_the_folder(tmp_path):
    assert catalogue.model_file("midas-v21-large", tmp_path) == tmp_path / "model-f6b98070.onnx"
    with pytest.raises(ConfigError, match=r"unknown model 'midas-v3'; the catalogue has depth-anything-v2-small, "):
        catalogue.model_file("midas-v3", tmp_path)


def test_resolve_runs_a_fetched_catalogue_model_with_its_profile(tmp_path):
    brightness_model(tmp_path / "depth_anything_v2_vits.onnx")

    spec = catalogue.resolve(ModelConfig(path="depth-anything-v2-small", folder=tmp_path), tmp_path)

    assert spec.path == tmp_path / "depth_anything_v2_vits.onnx"
    assert spec.profile == PROFILES["depth-anything-v2-small"]


def test_resolve_names_the_fetch_command_for_a_missing_catalogue_model(tmp_path):
    with pytest.raises(ModelError) as caught:
        catalogue.resolve(ModelConfig(path="midas-v21-large", folder=tmp_path), tmp_path)
    assert str(caught.value) == (
        f"model 'midas-v21-large' is not installed ({tmp_path / 'model-f6b98070.onnx'} is missing); "
        "fetch it with `depthwatch models fetch midas-v21-large`, or run an .onnx depth model you have "
        "with `--model PATH` (or model.path)"
    )
    assert caught.value.exit_code == 78


@pytest.mark.parametrize("config", [None, REPO / "config.yaml"], ids=["built-in defaults", "config.yaml"])
def test_run_without_the_default_model_says_which_command_fetches_it(tmp_path, config):
    args = ["-c", str(config)] if config else []

    done = subprocess.run(
        [sys.executable, "-m", "depthwatch", "run", *args],
        capture_output=True, text=True, env=cli_env(tmp_path), cwd=tmp_path, timeout=60, check=False,
    )

    missing = default_models_dir(tmp_path) / "model-small.onnx"
    assert done.returncode == 78
    assert done.stderr == (
        f"depthwatch: model 'midas-v21-small' is not installed ({missing} is missing); "
        "fetch it with `depthwatch models fetch midas-v21-small`, or run an .onnx depth model you have "
        "with `--model PATH` (or model.path)\n"
    )
    assert not missing.parent.exists()  # nothing was downloaded, nor a folder made for it


def test_models_list_shows_what_is_in_the_configs_model_folder(tmp_path):
    folder = tmp_path / "weights"
    folder.mkdir()
    brightness_model(folder / "model-f6b98070.onnx")
    config = tmp_path / "depthwatch.yaml"
    config.write_text("model:\n  path: midas-v21-large\n  folder: ./weights\n", encoding="utf-8")

    done = subprocess.run(
        [sys.executable, "-m", "depthwatch", "models", "list", "-c", str(config)],
        capture_output=True, text=True, env=cli_env(tmp_path), cwd=tmp_path, timeout=60, check=False,
    )

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"model folder: {folder}"
    assert re.match(r"NAME\s+STATE\s+FILE\s+SIZE\s+INPUT\s+LICENCE\s+MODEL$", lines[1])
    rows = {line.split()[0]: line for line in lines[2:5]}
    size = (folder / "model-f6b98070.onnx").stat().st_size
    assert re.match(
        rf"midas-v21-large \*\s+unverified\s+model-f6b98070\.onnx\s+{size} bytes\s+384 px\s+MIT\s+MiDaS v2\.1 large",
        rows["midas-v21-large"],
    )
    assert re.match(r"midas-v21-small\s+missing\s+model-small\.onnx\s+~64 MB\s+256 px\s+MIT\s+MiDaS v2\.1 small$", rows["midas-v21-small"])
    assert re.match(
        r"depth-anything-v2-small\s+missing\s+depth_anything_v2_vits\.onnx\s+~99 MB\s+518 px\s+Apache-2\.0\s",
        rows["depth-anything-v2-small"],
    )
    assert "midas-v21-large has no checksum yet: `depthwatch models fetch midas-v21-large` checks it loads and records one" in lines
