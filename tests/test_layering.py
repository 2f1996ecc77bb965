"""Snapshot K holds only chapter K's code and what came before (course.layering).

Every snapshot's files are checked for run-time mentions of a later chapter's modules or names:
later chapters extend earlier ones through registries and engine extensions, never by editing
their files (docs/maintainers.md, "Chapters and manifests").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from course.layering import later_mentions
from course.manifest import Course

ROOT = Path(__file__).resolve().parent.parent

COURSE = Course.load(ROOT)


@pytest.mark.parametrize("k", sorted(COURSE.chapters))
def test_snapshot_files_mention_no_later_chapter(k: int) -> None:
    found = [f"{path}:{line}: {what}" for path, line, what in later_mentions(COURSE, k)]
    assert not found, "earlier files reach into later chapters:\n" + "\n".join(found)


def test_the_check_sees_a_lazy_import_a_find_spec_string_and_a_later_name(tmp_path: Path) -> None:
    """A copy of the course whose chapter 6 engine reaches into chapter 18 three ways."""
    import shutil

    shutil.copytree(ROOT / "chapters", tmp_path / "chapters")
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions", symlinks=True)
    engine = tmp_path / "solutions" / "minisgl" / "engine" / "engine.py"
    engine.write_text(
        engine.read_text()
        + "\n\ndef _leaks() -> None:\n"
        + "    from minisgl.engine.graph import graph_batch_sizes\n"
        + "    importlib.util.find_spec('minisgl.attention.fi')\n"
        + "    GraphRunner\n"
    )
    found = {
        what
        for path, _, what in later_mentions(Course.load(tmp_path), 6)
        if path == "engine/engine.py"
    }
    assert "imports minisgl.engine.graph (chapter 18)" in found
    assert "imports minisgl.attention.fi (chapter 17)" in found
    assert "names GraphRunner of engine/graph.py (chapter 18)" in found


def test_a_package_init_keeps_names_and_present_modules_and_drops_absent_ones() -> None:
    from course.source import filter_init

    text = (
        "from .engine import Engine\n"
        "from .graph import GraphRunner\n"
        "from minisgl.engine import EngineExtension\n"
        "from minisgl.distributed import extension\n"
        "from minisgl import kernels\n"
    )
    known = {
        "engine/engine.py",
        "engine/graph.py",
        "distributed/extension.py",
        "kernels/__init__.py",
    }
    kept = filter_init(text, "engine/__init__.py", {"engine/engine.py"}, known)
    assert kept == "from .engine import Engine\nfrom minisgl.engine import EngineExtension\n"
    everything = filter_init(text, "engine/__init__.py", known, known)
    assert everything == text
