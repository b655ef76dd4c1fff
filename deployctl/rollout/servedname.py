"""The model name each release answers to (``model.served_name``, else the model directory's name: what clients
send as ``"model"``), read back from its release.json (``served_model_name``, written by deployctl.render.release).

A change between the stable release and the new one is a breaking change: every client still sending the old name
gets 404 from the new release (an engine answers only to its served name). ``deploy`` names it and refuses it unless
``--allow-served-name-change`` says it is meant (``check_change``). An abort and a rollback verify each release
under its own name (``as_release``): the old release asked with the new name answers 404 and would be taken for
broken.
"""
from __future__ import annotations

import json
import posixpath
import shlex
from typing import Optional

from deployctl.config import DeployConfig
from deployctl.errors import UsageError
from deployctl.config.layout import release_dir


def served_name_of(host, release_id: str, *, timeout: float = 15) -> Optional[str]:
    """The served model name in release ``release_id``'s release.json on ``host``; None when unreadable or absent
    (a release rendered before the field). Raises RemoteError when the host cannot be reached."""
    path = posixpath.join(release_dir(host.config, release_id), "release.json")
    r = host.run(f"cat {shlex.quote(path)} 2>/dev/null || true", timeout=timeout)
    try:
        name = json.loads(r.stdout).get("served_model_name")
    except (ValueError, AttributeError):
        return None
    return str(name) if name else None


def with_name(cfg: DeployConfig, name: Optional[str]) -> DeployConfig:
    """``cfg`` with model.served_name ``name`` (``cfg`` itself when None or already so)."""
    if not name or name == cfg.model.name:
        return cfg
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"served_name": name})})


def as_release(cfg: DeployConfig, host, release_id: Optional[str]) -> DeployConfig:
    """``cfg`` as release ``release_id`` on ``host`` answers: with that release's served name (module doc)."""
    if not release_id:
        return cfg
    try:
        return with_name(cfg, served_name_of(host, release_id))
    except Exception:  # unreadable: the configured name, as before
        return cfg


def check_change(cfg: DeployConfig, host, from_release: Optional[str], *, allow: bool) -> Optional[str]:
    """The breaking-change line when the new release's served name differs from ``from_release``'s on ``host``
    (None when the same, unknown, or no release before). Raises UsageError (exit 2, before anything changes) when
    it differs and ``allow`` is False."""
    if not from_release:
        return None
    old = served_name_of(host, from_release)
    new = cfg.model.name
    if not old or old == new:
        return None
    line = (f"breaking change: model.served_name changes from {old!r} ({from_release}) to {new!r}: clients that "
            f"send \"model\": {old!r} get 404 from the new release")
    if not allow:
        raise UsageError(f"deploy refused: {line}",
                         fix=f"move the clients to {new!r} first and pass --allow-served-name-change, or set "
                             f"model.served_name: {old!r} in deploy.yaml to keep the name")
    return line
