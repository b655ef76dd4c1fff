"""Where runbooks come from: the shipped runbooks/ folder, then the folders in ``$DEPLOYCTL_RUNBOOKS_PATH``
(``:``-separated; the operator's own runbooks). A runbook's name is its file's stem; a later folder's file of the
same name replaces the shipped one."""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

from deployctl import settings
from deployctl.errors import ConfigError, UsageError
from deployctl.runbook.model import Runbook, load_runbook

ENV_PATH = settings.RUNBOOKS_PATH_VAR


def search_path() -> list[Path]:
    from deployctl.resources import runbooks_dir

    return [runbooks_dir(), *settings.current().runbooks_path]


@dataclass
class Library:
    """Every runbook found, and the files that failed to load (each a ConfigError ``FILE:LINE: problem``)."""

    runbooks: dict[str, Runbook] = field(default_factory=dict)
    errors: list[ConfigError] = field(default_factory=list)
    files: dict[str, Path] = field(default_factory=dict)

    def get(self, name: str) -> Runbook:
        """The runbook ``name``. Raises ConfigError when its file is invalid, UsageError when there is none."""
        if name in self.runbooks:
            return self.runbooks[name]
        if name in self.files:
            raise next(e for e in self.errors if str(e).startswith(str(self.files[name])))
        guess = difflib.get_close_matches(name, list(self.runbooks), n=1)
        hint = f"did you mean {guess[0]!r}?" if guess else "see `deployctl runbook list`"
        raise UsageError(f"no runbook named {name!r}", fix=hint)


def load_library(dirs: list[Path] | None = None) -> Library:
    """Load every ``*.yaml`` / ``*.yml`` in ``dirs`` (default: ``search_path()``); bad files are collected,
    not raised, so the others still load."""
    lib = Library()
    for d in dirs if dirs is not None else search_path():
        if not d.is_dir():
            lib.errors.append(ConfigError(f"{d}: runbook folder does not exist", fix=f"fix ${ENV_PATH}"))
            continue
        for path in sorted([*d.glob("*.yaml"), *d.glob("*.yml")]):
            lib.files[path.stem] = path
            lib.runbooks.pop(path.stem, None)
            try:
                lib.runbooks[path.stem] = load_runbook(path)
            except ConfigError as err:
                lib.errors.append(err)
    return lib
