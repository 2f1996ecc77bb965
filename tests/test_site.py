"""The textbook site: anatomy of every chapter page, real code and output, and a real browser.

Needs the captured outputs in docs/_outputs/ (written by `python tools/steps.py check`), as the
strict build does.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import build_site

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
CHAPTER_PAGES = sorted((ROOT / "docs" / "chapters").glob("ch*.md"))
STAGE_PAGES = sorted((ROOT / "docs" / "stages").glob("*.md"))
OUTPUTS = ROOT / "docs" / "_outputs"
ANATOMY = [
    "Self-test",
    "Files you will write",
    "Files so far",
    "This step's main",
    "What it prints",
    "Reading the output",
    "Where it lives upstream",
    "Tests",
    "How to explain it",
    "Exercises",
    "Summary",
    "Practice problems",
]
MIN_PROSE_WORDS = 1200
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.MULTILINE | re.DOTALL)


def prose_words(markdown: str) -> int:
    """Words outside fenced blocks, directive lines and admonition/collapsible markers."""
    text = FENCE.sub("", markdown)
    lines = [
        line
        for line in text.splitlines()
        if not line.startswith("::") and not re.match(r"\s*(\?\?\?|!!!)", line)
    ]
    return len(re.findall(r"[A-Za-z][\w'-]*", "\n".join(lines)))


@pytest.fixture(scope="module")
def site(built_site: Path) -> Path:
    return built_site


def test_every_chapter_of_the_manifests_has_its_page_and_no_page_is_orphaned() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    from course.manifest import Course

    wanted = {ROOT / m.docs for m in Course.load(ROOT).chapters.values()}
    assert wanted == set(CHAPTER_PAGES), f"chapter pages found: {[p.name for p in CHAPTER_PAGES]}"


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


ENGINE = ROOT / "solutions" / "minisgl"


def upstream_table_names(guide: str) -> list[str]:
    """The code spans of the "ours" column (the name column of "Same name, different meaning")
    of every table under the maintainers' guide's "Names against upstream"."""
    section = guide.split("## Names against upstream", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (?!ours \||name \||---)(.+?) \|", section, re.MULTILINE)
    return [span for row in rows for span in re.findall(r"`([^`]+)`", row)]


@functools.cache
def engine_sources() -> dict[Path, str]:
    return {path: path.read_text() for path in ENGINE.rglob("*.py")}


def missing_from_engine(span: str) -> str | None:
    """Why the name a table span names is not in solutions/minisgl/ (None if it is there).

    A path must exist; a flag or string literal must appear in the source; for `a.b`, `b` must
    be defined (a def, a class, an assignment, a field) in module `a` (a file or package of that
    name) or in the file defining class `a`; a plain name anywhere.
    """
    sources = engine_sources()
    if span.endswith(".py") or "/" in span:
        return None if (ENGINE / span).exists() else f"no file {span}"
    if span.startswith("--") or span.startswith('"'):
        literal = span if span.startswith('"') else f'"{span}"'
        return None if any(literal in text for text in sources.values()) else f"no {literal}"
    parts = re.split(r"[([]", span, maxsplit=1)[0].removeprefix("minisgl.").split(".")
    if not parts[-1].isidentifier():
        return None  # an expression, not a name: (cached_len, handle)
    *qualifier, name = parts
    packages = {path.stem for path in sources} | {path.parent.name for path in sources}
    if not qualifier and name in packages:
        return None
    files = list(sources)
    if qualifier:
        owner = qualifier[-1]
        files = [
            path
            for path, text in sources.items()
            if path.stem == owner
            or owner in path.relative_to(ENGINE).parts[:-1]
            or re.search(rf"^class {owner}\b", text, re.MULTILINE)
        ]
        if not files:
            return f"no module or class {owner}"
    definition = re.compile(
        rf"^\s*(async def |def |class ){name}\b|^\s*{name}\s*[:=]|\bself\.{name}\s*[:=]",
        re.MULTILINE,
    )
    if not any(definition.search(sources[path]) for path in files):
        return f"{name} is defined in none of {sorted(str(p.relative_to(ENGINE)) for p in files)}"
    return None


def test_every_ours_name_of_the_upstream_table_exists_in_the_engine() -> None:
    """A rename in the engine must update docs/maintainers.md's table of names."""
    names = upstream_table_names((ROOT / "docs" / "maintainers.md").read_text())
    assert len(names) > 200, "the table was not found"
    missing = {span: why for span in names if (why := missing_from_engine(span))}
    assert not missing, f"docs/maintainers.md names what solutions/minisgl/ lacks: {missing}"


@pytest.mark.parametrize(
    "span", ["info.TPInformation", "engine.ATTENTION_BACKENDS", "kernels/nothing.py", "--no-flag"]
)
def test_a_name_the_engine_lacks_is_reported(span: str) -> None:
    assert missing_from_engine(span)


@pytest.mark.parametrize("page", CHAPTER_PAGES, ids=lambda p: p.stem)
def test_chapter_page_has_enough_prose(page: Path) -> None:
    words = prose_words(page.read_text())
    assert words >= MIN_PROSE_WORDS, f"{page.name}: {words} words of prose < {MIN_PROSE_WORDS}"


@pytest.mark.parametrize("page", sorted((ROOT / "docs").rglob("*.md")), ids=lambda p: p.stem)
def test_no_code_or_output_typed_by_hand(page: Path) -> None:
    """Code listings and outputs come from directives; only shell commands may be typed."""
    for match in FENCE.finditer(page.read_text()):
        fence = match.group(0).splitlines()[0].strip()
        diagram = fence == "```mermaid" or (fence == "```text" and page.name == "architecture.md")
        assert fence == "```bash" or diagram, (
            f"{page.relative_to(ROOT)} has a hand-typed block: {fence}"
        )


@pytest.mark.parametrize("page", CHAPTER_PAGES + STAGE_PAGES, ids=lambda p: p.stem)
def test_every_chapter_and_stage_page_has_a_figure(page: Path) -> None:
    markdown = page.read_text()
    assert re.search(r"^::figure |^```mermaid$", markdown, re.MULTILINE), (
        f"{page.relative_to(ROOT)} has no figure (::figure of a captured run, or mermaid)"
    )


# A paragraph that reports a measurement: it says so, names the machine, or dates a run.
MEASURED_PARAGRAPH = re.compile(r"measur|\bH200s?\b|\b20\d\d-\d\d-\d\d\b", re.IGNORECASE)
UNITS = r"ms|us|µs|s|(?:output )?tok(?:en)?s/s|(?:output )?tokens per second|requests/s|MiB|%"
FIGURE_WITH_UNIT = re.compile(rf"(?<![\w.,])\d[\d,]*(?:\.\d+)?(?: ?(?:{UNITS})|x| times)(?![\w/])")
RESULT_FIGURE = re.compile(r"\{\{result (.+?)\}\}", re.DOTALL)
RESULT_TABLE = re.compile(r"^\{\{table (.+?)\}\}[ \t]*$", re.MULTILINE | re.DOTALL)


def paragraphs(markdown: str) -> list[str]:
    """A page's prose paragraphs and list items, without code, directives, link definitions
    or result figures (the build computes those from their result lines)."""
    text = RESULT_TABLE.sub("", RESULT_FIGURE.sub("", FENCE.sub("", markdown)))
    text = re.sub(r"`[^`]*`", "", text)
    text = re.sub(r"^(?:::|\[[^\]]+\]: ).*$", "", text, flags=re.MULTILINE)
    blocks = re.split(r"\n\s*\n|\n(?=\s*(?:[-*]|\d+\.|#+) )", text)
    return [" ".join(block.split()) for block in blocks]


def in_text(number: str, text: str) -> bool:
    """Whether `number` appears in `text` as a whole number (not inside another one)."""
    return re.search(rf"(?<![\d.,]){re.escape(number)}(?![\d]|[.,]\d)", text) is not None


@pytest.mark.parametrize("page", sorted((ROOT / "docs").rglob("*.md")), ids=lambda p: p.stem)
def test_every_measured_figure_comes_from_a_result_line_or_a_captured_output(page: Path) -> None:
    """In a paragraph that reports a measurement, a time, rate, memory size, percentage or
    ratio is a `{{result ...}}` figure, computed at build time from a committed result line,
    or appears in a captured output the page embeds. A typed figure would drift from the
    line it came from, or come from none."""
    markdown = page.read_text()
    captured = " ".join(
        (OUTPUTS / f"{name}.txt").read_text()
        for name in re.findall(r"^::output (\S+)$", markdown, re.MULTILINE)
    )
    typed = [
        figure
        for paragraph in paragraphs(markdown)
        if MEASURED_PARAGRAPH.search(paragraph)
        for figure in FIGURE_WITH_UNIT.findall(paragraph)
        if not in_text(re.match(r"[\d,.]*\d", figure).group(0), captured)  # type: ignore[union-attr]
    ]
    assert not typed, (
        f"{page.relative_to(ROOT)}: measured figures typed by hand: {typed}; write them as "
        "{{result EXPR | FORMAT | SELECTOR}} (docs/hooks/directives.py)"
    )
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    import directives

    for spec in RESULT_FIGURE.findall(FENCE.sub("", markdown)):
        if f"`{{{{result {spec}}}}}`" not in markdown:  # quoted in a code span: not a figure
            directives.result_figure(spec)  # each selects one line and computes
    for spec in RESULT_TABLE.findall(FENCE.sub("", markdown)):
        directives.result_table(spec)  # each selects its lines, one per cell, and computes


def test_a_result_figure_is_computed_from_the_one_line_it_selects() -> None:
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    import directives
    from mkdocs.exceptions import PluginError

    line = "variant=torch-backend date=2026-12-01T16:35"
    shown = directives.result_figure(f"output_tokens / seconds | ,.0f | {line}")
    assert re.fullmatch(r'<abbr class="measured" title="[^"]+">3,870</abbr>', shown), shown
    assert "--variants torch-backend" in shown and "NVIDIA H200" in shown
    assert "2026-12-01T16:35:10" in shown
    for ambiguous in ("variant=minisgl date=2026-12", "variant=torch-backend"):
        with pytest.raises(PluginError):  # several lines, or a selector a new line could match
            directives.result_figure(f"seconds | .1f | {ambiguous}")
    with pytest.raises(PluginError):
        directives.result_figure(f"__import__('os') | s | {line}")


def test_a_result_table_has_a_cell_per_line_and_says_what_measured_it() -> None:
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    import directives
    from mkdocs.exceptions import PluginError

    lines = "benchmark=attention_kernel page_size=16 date=2026-12-01T19:45"
    pivot = directives.result_table(f"context x batch | seconds * 1e6 | .1f | {lines}")
    header, rule, *rows, _, caption = pivot.strip().split("\n")
    assert header == "| context | batch 64 | batch 256 |" and rule == "|---|---:|---:|"
    seconds = {
        (r["context"], r["batch"]): r["seconds"] for _, r in directives.select_results(lines)
    }
    assert rows == [
        f"| {context} | "
        + " | ".join(f"{seconds[context, batch] * 1e6:.1f}" for batch in (64, 256))
        + " |"
        for context in (512, 2048)
    ]
    assert caption.startswith("Measured by `python benchmark/attention_kernels.py")
    per_line = directives.result_table(
        f"batch context | us: seconds * 1e6; n: batch | .1f | {lines}"
    )
    assert per_line.split("\n")[0] == "| batch context | us | n |"
    with pytest.raises(PluginError):  # two lines for one cell
        directives.result_table(
            "batch x layout | seconds | .1f | benchmark=attention_kernel date=2026-12-01T19:45"
        )
    with pytest.raises(PluginError):  # no line at all
        directives.result_table("a x b | seconds | .1f | benchmark=none date=2026-12-01")


UPSTREAM = "https://github.com/sgl-project/mini-sglang"
UPSTREAM_PIN = "20fcd7f3c6a1898a61139fae1c97cc7a40bd8d66"  # docs/maintainers.md, names table


@pytest.mark.parametrize("page", CHAPTER_PAGES, ids=lambda p: p.stem)
def test_where_it_lives_upstream_cites_file_and_line_at_the_pinned_commit(page: Path) -> None:
    """Upstream moves; a citation of its main would rot. Every upstream link is a file and line
    at the pinned commit, and each chapter's upstream section cites at least one."""
    markdown = page.read_text()
    section = markdown.split("## Where it lives upstream", 1)[1].split("\n## ", 1)[0]
    assert f"`{UPSTREAM_PIN[:7]}`" in section, f"{page.name}: the section names no commit"
    links = re.findall(rf"{re.escape(UPSTREAM)}[^\s)>]*", markdown)
    cited = [link for link in links if link != UPSTREAM]
    pinned = re.compile(rf"{re.escape(UPSTREAM)}/blob/{UPSTREAM_PIN}/\S+#L\d+")
    assert cited and all(pinned.fullmatch(link) for link in cited), (
        f"{page.name}: upstream links not at {UPSTREAM_PIN[:7]} with a line: "
        f"{[link for link in cited if not pinned.fullmatch(link)][:3]}"
    )


def test_admission_figure_reads_each_requests_phase_off_the_trace() -> None:
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    import figures

    trace = [
        {"running": [0], "waiting": [1]},  # 0 prefilled, 1 waits
        {"running": [0], "waiting": [1]},  # 0 decodes
        {"running": [], "waiting": [1]},  # 0 decodes its last token and finishes
        {"running": [1], "waiting": []},
    ]  # 1 is prefilled
    assert figures.request_states(trace) == {
        0: ["prefill", "decode", "decode", ""],
        1: ["waiting", "waiting", "waiting", "prefill"],
    }


def test_every_captured_figure_is_on_a_page() -> None:
    """Engine-state figures are drawn from data a chapter main captured; none is left unused."""
    used = {
        m
        for page in (ROOT / "docs").rglob("*.md")
        for m in re.findall(r"^::figure (\S+)$", page.read_text(), re.MULTILINE)
    }
    captured = {path.stem for path in OUTPUTS.glob("*.json")}
    assert captured and captured <= used, f"captured but never drawn: {sorted(captured - used)}"


def test_chapter_page_embeds_real_code_tree_and_output(site: Path) -> None:
    html = (site / "chapters" / "ch08_cache_manager" / "index.html").read_text()
    assert "solutions/minisgl/scheduler/cache.py · CacheManager" in html
    assert "Files so far:" in html
    captured = (ROOT / "docs" / "_outputs" / "ch08_cache_manager.txt").read_text()
    last_line = captured.strip().splitlines()[-1]
    assert last_line.split()[0] in html, "the captured output is not on the page"
    assert (site / "notebooks" / "ch08_cache_manager.ipynb").is_file()
    assert "jupytext" not in html, "the example is shown with its jupytext header"
    assert re.search(r'<figure class="minisgl-figure">\s*<svg', html), "no figure was drawn"
    assert ".venv/bin/python practice/judge.py start" in html


@pytest.mark.parametrize("page", sorted((ROOT / "docs").rglob("*.md")), ids=lambda p: p.stem)
def test_commands_on_the_site_use_the_projects_interpreter(page: Path) -> None:
    # A result selector may name its line by the command recorded in it (command="..."): a
    # field's value, never shown as a command, so the {{...}} directives are left out.
    shown = re.sub(r"\{\{.*?\}\}", "", page.read_text(), flags=re.DOTALL)
    command = r"(?<!\.venv/bin/)\bpython3? (?:tools|practice|examples|benchmark)/\S+"
    bare = re.findall(command, shown)
    assert not bare, f"{page.relative_to(ROOT)}: use .venv/bin/python, not {bare}"


class FoldedText(HTMLParser):
    """A page's text, split into what a reader sees on load and what is inside a closed
    <details> (a collapsed admonition)."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.closed: list[bool] = []  # for each <details> we are in: is it closed?
        self.visible: list[str] = []
        self.folded: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "details":
            self.closed.append("open" not in dict(attrs))

    def handle_endtag(self, tag: str) -> None:
        if tag == "details" and self.closed:
            self.closed.pop()

    def handle_data(self, data: str) -> None:
        (self.folded if any(self.closed) else self.visible).append(data)

    def text(self, folded: bool) -> str:
        return " ".join("".join(self.folded if folded else self.visible).split())


def stub_parts(stub: str) -> tuple[str, str]:
    """A stub's first docstring line and the first line of its body, from the reference."""
    path, _, symbol = stub.partition(":")
    source = (ROOT / "solutions" / "minisgl" / path).read_text()
    scope: list[ast.stmt] = ast.parse(source).body
    for name in symbol.split("."):
        node = next(n for n in scope if getattr(n, "name", None) == name)
        scope = node.body  # type: ignore[attr-defined]
    doc = ast.get_docstring(node)  # type: ignore[arg-type]
    assert doc, f"stub {stub} has no docstring"
    body = scope[1] if isinstance(scope[0], ast.Expr) else scope[0]
    return doc.splitlines()[0], source.splitlines()[body.lineno - 1].strip()


def shown_stubs(chapter: str, page: str) -> list[str]:
    """Chapter `chapter`'s stubs that page docs/chapters/<page>.md shows with ::code."""
    manifest = tomllib.loads((ROOT / "chapters" / chapter / "chapter.toml").read_text())
    markdown = (ROOT / "docs" / "chapters" / f"{page}.md").read_text()
    shown = re.findall(r"^::code (\S+)$", markdown, re.MULTILINE)
    return [
        stub
        for stub in manifest["stubs"]
        if any(stub == t or stub.startswith(t + ".") for t in shown)
    ]


def test_only_the_chapters_own_stubs_are_folded(site: Path) -> None:
    """Chapter 10 folds its own stubs' bodies and leaves chapter 8's code it shows open."""
    page = FoldedText((site / "chapters" / "ch10_chunked" / "index.html").read_text())
    own, earlier = (
        shown_stubs("ch10_chunked", "ch10_chunked"),
        shown_stubs("ch08_cache_manager", "ch10_chunked"),
    )
    assert own and earlier, "the test needs chapter 10's page to show stubs of chapters 10 and 8"
    for stub in own:
        doc, body = stub_parts(stub)
        assert doc in page.text(folded=False) and body in page.text(folded=True), stub
    for stub in earlier:
        doc, body = stub_parts(stub)
        assert body in page.text(folded=False) and body not in page.text(folded=True), stub


def test_notebook_runs_the_students_work_tree_when_there_is_one(site: Path, tmp_path: Path) -> None:
    notebook = json.loads((site / "notebooks" / "ch08_cache_manager.ipynb").read_text())
    first = "".join(notebook["cells"][0]["source"])
    (tmp_path / "work" / "minisgl").mkdir(parents=True)
    (tmp_path / "work" / "minisgl" / "__init__.py").write_text("")
    (tmp_path / "examples").mkdir()  # notebooks run from examples/ or from the repository root
    for cwd in (tmp_path, tmp_path / "examples"):
        run = subprocess.run(
            [sys.executable, "-c", first], cwd=cwd, capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 0, run.stderr
        assert str(tmp_path / "work" / "minisgl") in run.stdout, run.stdout


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
    _, first_statement = stub_parts("scheduler/cache.py:CacheManager.allocate_paged")
    indent = " " * 8  # a method body
    cache_py.write_text(
        source.replace(
            f"{indent}{first_statement}\n", f"{indent}{marker}\n{indent}{first_statement}\n", 1
        )
    )
    assert build_site(copy, tmp_path / "site1").returncode == 0
    page = (tmp_path / "site1" / "chapters" / "ch08_cache_manager" / "index.html").read_text()
    assert marker in page, "the page did not pick up the changed code"

    cache_py.write_text(source.replace("def allocate_paged(", "def allocate_pages_renamed("))
    result = build_site(copy, tmp_path / "site2")
    assert result.returncode != 0 and "allocate_paged" in result.stderr, result.stderr[-2000:]

    cache_py.write_text(source)
    (copy / "docs" / "_outputs" / "ch08_cache_manager.admission.json").unlink()
    result = build_site(copy, tmp_path / "site3")
    assert result.returncode != 0 and "ch08_cache_manager.admission" in result.stderr, (
        result.stderr[-2000:]
    )


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


# Headless, and quiet: without the last four, Chromium phones home at start-up, which on a closed
# network only fails, and would show up as requests the pages never made.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.mark.slow
def test_chapter_page_renders_in_headless_chromium(site: Path, tmp_path: Path) -> None:
    browser = require_chromium()
    page = site / "chapters" / "ch08_cache_manager" / "index.html"
    flags = [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"]
    dom = subprocess.run(
        [browser, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    assert dom.count('class="highlight') >= 5, "code blocks were not rendered"
    assert "Files so far:" in dom and "Reading the output" in dom
    rendered = FoldedText(dom)
    stubs = shown_stubs("ch08_cache_manager", "ch08_cache_manager")
    assert stubs, "chapter 8's page shows none of its stubs"
    for stub in stubs:  # the task open, the reference solution folded away
        doc, body = stub_parts(stub)
        assert doc in rendered.text(folded=False), f"{stub}: its docstring is not shown open"
        assert body in rendered.text(folded=True), f"{stub}: its body is not folded"
        assert body not in rendered.text(folded=False), f"{stub}: its body is shown open"
    screenshot = ROOT / "build" / "site-ch08.png"  # build/ is git-ignored
    screenshot.parent.mkdir(exist_ok=True)
    # The virtual time budget lets the page finish rendering before the screenshot.
    subprocess.run(
        [
            browser,
            *flags,
            "--virtual-time-budget=10000",
            f"--screenshot={screenshot}",
            "--window-size=1280,2000",
            page.as_uri(),
        ],
        capture_output=True,
        timeout=120,
    )
    assert screenshot.is_file() and screenshot.stat().st_size > 10_000


# --- the site works offline ----------------------------------------------------------------


@contextlib.contextmanager
def served(folder: Path) -> Iterator[str]:
    """`folder` over http on 127.0.0.1 (as a reader's `mkdocs serve` or any static host)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def open_page(browser: str, url: str, work: Path) -> tuple[str, set[str]]:
    """Load `url` in headless Chromium until its scripts have run; its DOM, and every host the
    page asked for anything: Chromium's own log of its network requests, not the HTML, so a
    script that fetches from a CDN shows up too. A request the page made names the page's origin
    as its initiator; Chromium's own calls home (which the flags do not all stop) name none."""
    work.mkdir(parents=True, exist_ok=True)
    log = work / "netlog.json"
    dom = subprocess.run(
        [
            browser,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={work / 'profile'}",
            f"--log-net-log={log}",
            "--virtual-time-budget=15000",  # time for the page's scripts to finish
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    netlog = json.loads(log.read_text(errors="replace"))
    start = netlog["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    requests = [e.get("params", {}) for e in netlog["events"] if e["type"] == start]
    hosts = {
        urllib.parse.urlsplit(r.get("url", "")).hostname
        for r in requests
        if str(r.get("initiator", "")).startswith("http")
    }
    return dom, {host for host in hosts if host}


def require_chromium() -> str:
    browser = chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: ./run installs Debian's chromium")
        pytest.skip("chromium is not installed (./run installs it)")
    return browser


@pytest.mark.slow
def test_pages_request_nothing_from_another_host_and_draw_their_diagrams(
    site: Path, tmp_path: Path
) -> None:
    browser = require_chromium()
    control = tmp_path / "control"  # a page the check must refuse: it asks two other hosts
    control.mkdir()
    (control / "index.html").write_text(
        '<img src="https://cdn.example.org/x.png"><script src="https://unpkg.com/x.js"></script>'
    )
    with served(control) as url:
        _, hosts = open_page(browser, f"{url}/", tmp_path / "control-run")
        assert {"cdn.example.org", "unpkg.com"} <= hosts, hosts
    with served(site) as url:
        for page in ("stages/stage2/", "chapters/ch08_cache_manager/", "practice/"):
            dom, hosts = open_page(browser, f"{url}/{page}", tmp_path / page.replace("/", "-"))
            assert hosts == {"127.0.0.1"}, f"{page} asked other hosts: {sorted(hosts)}"
            if page.startswith("stages"):  # Mermaid (vendored) replaced the diagram's source
                assert 'class="mermaid"' in dom and "flowchart" not in dom, page
