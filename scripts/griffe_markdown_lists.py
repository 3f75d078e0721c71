"""A griffe extension for the API pages (`make docs`): lists in docstrings render as lists.

Our docstrings write `**Arguments:**` on one line and the `- name: ...` items right below it, as
equinox does. Python-Markdown (what MkDocs uses) starts a list only after a blank line, so the
items would run into one paragraph. This extension inserts that blank line in the text given to
mkdocstrings; the docstrings in the source stay as they are. Loaded by path from mkdocs.yml.
"""

from __future__ import annotations

from typing import Any

import griffe

_ITEM = ("- ", "* ")


def separate_lists(text: str) -> str:
    """`text` with a blank line before every list that follows a paragraph line directly."""
    out: list[str] = []
    in_list = in_fence = False
    for line in text.split("\n"):
        stripped = line.lstrip()
        if stripped.startswith("```"):
            in_fence = not in_fence
        if in_fence or stripped.startswith("```"):
            in_list = False
        elif stripped.startswith(_ITEM) and line == stripped:
            if not in_list and out and out[-1].strip():
                out.append("")
            in_list = True
        elif stripped and line == stripped:  # a paragraph line at the left margin ends a list
            in_list = False
        out.append(line)
    return "\n".join(out)


class SeparateLists(griffe.Extension):
    """Rewrite each docstring with `separate_lists` when griffe loads its object."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = separate_lists(obj.docstring.value)
