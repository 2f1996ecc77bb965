"""The textbook site: anatomy of every chapter page, real code and output, and a real browser.

Needs the captured outputs in docs/_outputs/ (written by `python tools/steps.py check`), as the
strict build does.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTER_PAGES = sorted((ROOT / "docs" / "chapters").glob("ch*.md"))
ANATOMY = ["Self-test", "Files you will write", "Files so far", "This step's main",
           "What it prints", "Reading the output", "Where it lives upstream", "Tests",
           "How to explain it", "Exercises", "Summary", "Practice problems"]
MIN_PROSE_WORDS = 1200
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.MULTILINE | re.DOTALL)


def prose_words(markdown: str) -> int:
    """Words outside fenced blocks, directive lines and admonition/collapsible markers."""
    text = FENCE.sub("", markdown)
    lines = [line for line in text.splitlines()
             if not line.startswith("::") and not re.match(r"\s*(\?\?\?|!!!)", line)]
    return len(re.findall(r"[A-Za-z][\w'-]*", "\n".join(lines)))


def build_site(root: Path, out: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MINISGL_DOCS_DRAFT"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                           "-f", str(root / "mkdocs.yml"), "-d", str(out)],
                          capture_output=True, text=True, cwd=root, env=env, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = build_site(ROOT, out)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-3000:]}"
    return out


def test_chapters_0_to_11_have_pages() -> None:
    numbers = sorted(int(p.name[2:4]) for p in CHAPTER_PAGES)
    assert numbers[:12] == list(range(12)), f"chapter pages found: {numbers}"


@pytest.mark.parametrize("page", CHAPTER_PAGES, ids=lambda p: p.stem)
def test_chapter_page_has_every_anatomy_section_in_order(page: Path) -> None:
    headings = re.findall(r"^## (.+)$", page.read_text(), re.MULTILINE)
    positions = []
    for section in ANATOMY:
        assert section in headings, f"{page.name} lacks the section '## {section}'"
        positions.append(headings.index(section))
    assert positions == sorted(positions), f"{page.name}: sections out of order: {headings}"
    walkthrough = [h for h in headings if " · " in h]
    assert walkthrough, f"{page.name} has no walkthrough section headed 'path · Symbol'"


@pytest.mark.parametrize("page", CHAPTER_PAGES, ids=lambda p: p.stem)
def test_chapter_page_has_enough_prose(page: Path) -> None:
    words = prose_words(page.read_text())
    assert words >= MIN_PROSE_WORDS, f"{page.name}: {words} words of prose < {MIN_PROSE_WORDS}"


@pytest.mark.parametrize("page", sorted((ROOT / "docs").rglob("*.md")), ids=lambda p: p.stem)
def test_no_code_or_output_typed_by_hand(page: Path) -> None:
    """Code listings and outputs come from directives; only shell commands may be typed."""
    for match in FENCE.finditer(page.read_text()):
        fence = match.group(0).splitlines()[0].strip()
        diagram = fence == "```text" and page.name == "architecture.md"
        assert fence == "```bash" or diagram, f"{page.relative_to(ROOT)} has a hand-typed block: {fence}"


def test_chapter_page_embeds_real_code_tree_and_output(site: Path) -> None:
    html = (site / "chapters" / "ch08_cache_manager" / "index.html").read_text()
    assert "solutions/minisgl/scheduler/cache.py · CacheManager" in html
    assert "Files so far:" in html
    captured = (ROOT / "docs" / "_outputs" / "ch08_cache_manager.txt").read_text()
    last_line = captured.strip().splitlines()[-1]
    assert last_line.split()[0] in html, "the captured output is not on the page"
    assert (site / "notebooks" / "ch08_cache_manager.ipynb").is_file()


@pytest.mark.slow
def test_page_follows_the_code_and_a_missing_symbol_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    top_level = {".venv", "models", "site", "build", "work", ".git"}  # not solutions/.../models

    def ignore(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if n == "__pycache__" or (Path(folder) == ROOT and n in top_level)]

    shutil.copytree(ROOT, copy, ignore=ignore)
    cache_py = copy / "solutions" / "minisgl" / "scheduler" / "cache.py"
    source = cache_py.read_text()
    marker = "# a comment that only this test adds"
    cache_py.write_text(source.replace("        rows, cols, spans = [], [], []",
                                       f"        {marker}\n        rows, cols, spans = [], [], []"))
    assert build_site(copy, tmp_path / "site1").returncode == 0
    page = (tmp_path / "site1" / "chapters" / "ch08_cache_manager" / "index.html").read_text()
    assert marker in page, "the page did not pick up the changed code"

    cache_py.write_text(source.replace("def allocate_paged(", "def allocate_pages_renamed("))
    result = build_site(copy, tmp_path / "site2")
    assert result.returncode != 0 and "allocate_paged" in result.stderr, result.stderr[-2000:]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
def test_chapter_page_renders_in_headless_chromium(site: Path) -> None:
    browser = chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: ./run installs Debian's chromium")
        pytest.skip("chromium is not installed (./run installs it)")
    page = site / "chapters" / "ch08_cache_manager" / "index.html"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={site.parent / 'chromium-profile'}"]
    dom = subprocess.run([browser, *flags, "--dump-dom", page.as_uri()], capture_output=True,
                         text=True, timeout=120).stdout
    assert dom.count('class="highlight') >= 5, "code blocks were not rendered"
    assert "Files so far:" in dom and "Reading the output" in dom
    screenshot = ROOT / "build" / "site-ch08.png"  # build/ is git-ignored
    screenshot.parent.mkdir(exist_ok=True)
    subprocess.run([browser, *flags, f"--screenshot={screenshot}", "--window-size=1280,2000",
                    page.as_uri()], capture_output=True, timeout=120)
    assert screenshot.is_file() and screenshot.stat().st_size > 10_000
