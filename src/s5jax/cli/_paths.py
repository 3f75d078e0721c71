"""The type of the command's path arguments."""

from __future__ import annotations

from pathlib import Path


def path_arg(text: str) -> Path:
    """A path argument with `~` expanded: a quoted `'~/runs/x'` (from a script or a config of
    a job scheduler, where no shell expands it) names the home folder, not a folder called
    `~` in the current one."""
    return Path(text).expanduser()
