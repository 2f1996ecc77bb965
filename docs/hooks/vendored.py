"""mkdocs hook: the site's third-party browser code, served from the site itself.

A reader offline, or behind a firewall, gets every page whole: nothing is fetched from another
host. The packages come from npm (`npm ci --prefix practice/web`, which ./run does):
- Pyodide, which runs the practice problems in the reader's browser (practice_pages.py), is
  copied into `site/pyodide/`;
- Mermaid, which draws the diagrams, is copied into `site/assets/vendor/`. mkdocs-material
  would load it from unpkg.com, unless a `mermaid` global exists when its bundle mounts the
  diagrams (on DOMContentLoaded): the vendored script, a plain one after the bundle, defines it.
The theme's web fonts (Google Fonts) are switched off in mkdocs.yml (`font: false`).
A build without the packages fails, except a draft (MINISGL_DOCS_DRAFT=1), which warns.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

# The repository being built, which need not be the installed course's (a test builds a copy).
ROOT = Path(__file__).resolve().parents[2]
NODE_MODULES = ROOT / "practice" / "web" / "node_modules"
# site path -> the npm file it is copied from; only what a page needs at run time.
VENDORED = {
    **{
        f"pyodide/{name}": NODE_MODULES / "pyodide" / name
        for name in (
            "pyodide.mjs",
            "pyodide.asm.mjs",
            "pyodide.asm.wasm",
            "python_stdlib.zip",
            "pyodide-lock.json",
        )
    },
    "assets/vendor/mermaid.min.js": NODE_MODULES / "mermaid" / "dist" / "mermaid.min.js",
}
MERMAID = "assets/vendor/mermaid.min.js"
log = logging.getLogger("mkdocs.hooks.vendored")


def on_config(config: Any) -> Any:
    config.extra_javascript.append(MERMAID)
    return config


def on_files(files: Files, config: Any) -> Files:
    missing = [str(src.relative_to(ROOT)) for src in VENDORED.values() if not src.is_file()]
    if missing:
        error = f"npm packages are not installed ({', '.join(missing)} missing): run " + (
            "`npm ci --prefix practice/web`"
        )
        if os.environ.get("MINISGL_DOCS_DRAFT") != "1":
            raise PluginError(error)
        log.info(f"{error}; diagrams and Run buttons will not work (draft build)")
        return files
    for uri, src in VENDORED.items():
        files.append(File.generated(config, uri, abs_src_path=str(src)))
    return files
