"""Helpers for writing a chapter from a Python script (the .ipynb is what gets committed).

    from tools.nbbuild import chapter, md, code
    nb = chapter([md("# 3. Title"), code("x = 1", tags=["nbval-ignore-output"]), ...])
    nb.write("chapters/03_topic.ipynb")

``chapter`` puts the standard setup cell first. Execute the result with
tools/execute.py before committing.
"""

from __future__ import annotations

import textwrap

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from tools.setup_cell import setup_source


def md(text: str):
    return new_markdown_cell(textwrap.dedent(text).strip("\n"))


def code(text: str, tags: list[str] | None = None):
    cell = new_code_cell(textwrap.dedent(text).strip("\n"))
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


class _Chapter:
    def __init__(self, nb):
        self.nb = nb

    def write(self, path: str) -> None:
        nbformat.validate(self.nb)
        nbformat.write(self.nb, path)


def chapter(cells) -> _Chapter:
    """A notebook: the first markdown cell (the title), the setup cell, then the rest."""
    cells = list(cells)
    first, rest = cells[0], cells[1:]
    nb = new_notebook(cells=[first, code(setup_source(), tags=["hide-input"]), *rest])
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    return _Chapter(nb)
