"""The live explorers' files, put into the built site once for both editions (tools/dev.py book calls it).

    .venv/bin/python tools/live_assets.py [--html _build/html]

1. onnxruntime-web, pinned by web/package-lock.json: `npm ci` in web/ (Debian's node and npm) when
   web/node_modules does not hold the locked version yet;
2. into <html>/_static/live/: the runtime files a page needs (the WebAssembly CPU build only: ort.wasm.min.js,
   ort-wasm-simd-threaded.mjs and .wasm, and a notice of its licence), attnbook/explorers/attnbook_live.js, and each live
   explorer's graph and spec, exported from the package's own modules (attnbook.explorers.live.export_live).
   The Chinese edition, in <html>/zh_CN/, links to these same files (../_static/live/): there is one copy.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WEB = ROOT / "web"
RUNTIME = ["ort.wasm.min.js", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm"]
SCRIPT = ROOT / "attnbook" / "explorers" / "attnbook_live.js"
# what the exported graphs are computed from: a change to any of these exports them again
GRAPH_SOURCES = ["attnbook/explorers/live.py", "attnbook/core.py", "attnbook/explorers/masks.py"]


def locked_version() -> str:
    lock = json.loads((WEB / "package-lock.json").read_text(encoding="utf-8"))
    return lock["packages"]["node_modules/onnxruntime-web"]["version"]


def ensure_runtime() -> Path:
    """web/node_modules/onnxruntime-web/dist at the locked version (npm ci when it is not there)."""
    dist = WEB / "node_modules" / "onnxruntime-web" / "dist"
    installed = WEB / "node_modules" / "onnxruntime-web" / "package.json"
    want = locked_version()
    if not installed.exists() or json.loads(installed.read_text(encoding="utf-8"))["version"] != want:
        npm = shutil.which("npm")
        if npm is None:
            sys.exit("npm is needed for the live explorers' runtime: apt-get install -y nodejs npm")
        print(f"+ npm ci (onnxruntime-web {want})", flush=True)
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=WEB, check=True)
    return dist


def _digest() -> str:
    h = hashlib.sha256()
    for name in GRAPH_SOURCES:
        h.update((ROOT / name).read_bytes())
    import torch

    h.update(torch.__version__.encode())
    return h.hexdigest()


def export_graphs(target: Path) -> None:
    """The graphs and specs, exported once per change of their sources (cached in _build/live-cache/)."""
    cache = ROOT / "_build" / "live-cache"
    stamp = cache / "sources.sha256"
    digest = _digest()
    if not (stamp.exists() and stamp.read_text() == digest):
        from attnbook.explorers.live import export_live

        started = time.perf_counter()
        shutil.rmtree(cache, ignore_errors=True)
        written = export_live(cache)
        stamp.write_text(digest)
        print(f"exported {', '.join(p.name for p in written)} in {time.perf_counter() - started:.0f} s", flush=True)
    for path in cache.iterdir():
        if path.name != stamp.name:
            shutil.copy2(path, target / path.name)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--html", default=str(ROOT / "_build" / "html"), help="the built site (default _build/html)")
    args = ap.parse_args(argv)
    target = Path(args.html) / "_static" / "live"
    target.mkdir(parents=True, exist_ok=True)
    dist = ensure_runtime()
    for name in RUNTIME:
        shutil.copy2(dist / name, target / name)
    package = json.loads((WEB / "node_modules" / "onnxruntime-web" / "package.json").read_text(encoding="utf-8"))
    (target / "NOTICE.txt").write_text(f"onnxruntime-web {package['version']} ({package.get('license', '')} licence, "
                                       f"{package.get('author', 'Microsoft')}), from npm; attnbook_live.js and "
                                       "the graphs: attnbook's own.\n", encoding="utf-8")
    shutil.copy2(SCRIPT, target / SCRIPT.name)
    export_graphs(target)
    size = sum(p.stat().st_size for p in target.iterdir())
    print(f"live layer: {target} ({size / 1e6:.1f} MB, shared by every edition)")


if __name__ == "__main__":
    main()
