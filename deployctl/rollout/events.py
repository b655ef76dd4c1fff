"""Progress events: how the rollout tells the CLI (or the demo) what it is doing. Nothing here prints."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional


@dataclass(frozen=True)
class Event:
    """One progress event. ``kind`` is a short machine word (``step``, ``host``, ``analysis``, ``router``,
    ``abort``, ``info``, ``warn``, ``done``); ``message`` is one human line; ``data`` carries the numbers."""

    kind: str
    message: str
    data: dict[str, Any] = field(default_factory=dict)


Progress = Callable[[Event], None]


def emitter(progress: Optional[Progress]) -> Callable[..., None]:
    """A ``say(kind, message, **data)`` function that forwards to ``progress`` (or drops the event)."""

    def say(kind: str, message: str, **data: Any) -> None:
        if progress is not None:
            progress(Event(kind, message, data))

    return say
