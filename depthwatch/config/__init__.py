"""The one Config object, loaded from a hand-edited YAML file and checked strictly.

One module per job:

- `sections`: the schema, one frozen dataclass per section, each setting with
  its default and its check; `RENAMED`, the old names still read;
- `checks`: the value checks, each a sentence on failure;
- `reading`: YAML to a Config with every error at its file, line and column,
  and command-line overrides checked the same way;
- `discovery`: which file is used (-c, $DEPTHWATCH_CONFIG, the user's folder,
  ./config.yaml);
- `combinations`: settings fine alone but impossible together;
- `hosts`: whether the API's address reaches only this machine.

Callers import from here, whichever module a name lives in.

Why no schema library (pydantic v2, msgspec) for the checks: what users get
from a config is its messages, `file:line:column: output.jpeg_quality must be
between 1 and 100, not 500`, with a "did you mean" and what to do. Both
libraries report a path (`output.jpeg_quality`), not a place in the file, and
word their errors their own way ("Input should be less than or equal to 100",
"Expected `int`, got `float`"); both coerce unless made strict field by field.
Keeping every message as it is would take a custom validator on nearly every
field plus a translation of their error objects back to YAML nodes: more code
than the checks themselves (`checks`, under 200 lines), and a compiled
dependency for the daemon. The YAML nodes and the line marks stay with PyYAML.
"""

from __future__ import annotations

from depthwatch.config.combinations import check_combinations
from depthwatch.config.discovery import ENV_VAR, LOCAL_FILE, find
from depthwatch.config.reading import load, override, parse
from depthwatch.config.sections import (
    RENAMED,
    SECTIONS,
    ApiConfig,
    Config,
    DaemonConfig,
    FarmConfig,
    InputConfig,
    ModelConfig,
    OutputConfig,
    WatchConfig,
    defaults,
    dump_defaults,
)

__all__ = [
    "ENV_VAR",
    "LOCAL_FILE",
    "RENAMED",
    "SECTIONS",
    "ApiConfig",
    "Config",
    "DaemonConfig",
    "FarmConfig",
    "InputConfig",
    "ModelConfig",
    "OutputConfig",
    "WatchConfig",
    "check_combinations",
    "defaults",
    "dump_defaults",
    "find",
    "load",
    "override",
    "parse",
]
