"""The book's two configuration files, read with ``yaml.safe_load`` (never with regexes).

* ``_config.yml``: :func:`config`, and :func:`repository_url` (declared once there; the chapters' setup cell
  installs attnbook from it);
* ``_toc.yml``: :func:`toc_files`, every ``file:`` entry in order (the root page excluded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str) -> Any:
    return yaml.safe_load((ROOT / name).read_text(encoding="utf-8"))


def config() -> dict:
    """``_config.yml`` as a dict."""
    return _load("_config.yml")


def repository_url() -> str:
    """The repository address, ``repository: url:`` in ``_config.yml``."""
    url = (config().get("repository") or {}).get("url")
    if not isinstance(url, str) or not url:
        raise RuntimeError("no repository: url: in _config.yml")
    return url


def toc_files() -> list[str]:
    """Every ``file:`` of ``_toc.yml`` (chapters, parts and sections alike), in order, e.g.
    ``"chapters/01_soft_lookup"``; the ``root:`` page is not one."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "file" and isinstance(value, str):
                    found.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(_load("_toc.yml"))
    return found
