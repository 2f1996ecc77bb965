"""Browser practice: every browser problem is judged right on the vendored Pyodide, and a real
(headless) Chromium solves a problem on the built site and stops an infinite loop.

Needs node and the npm package (`npm ci --prefix practice/web`) and Debian's chromium (./run
installs both). The site is the one built once per test session (conftest.built_site).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent
WEB = ROOT / "practice" / "web"
sys.path.insert(0, str(ROOT / "practice"))
sys.path.insert(0, str(WEB))
import judge  # noqa: E402
import runner  # noqa: E402

BROWSER_PROBLEMS = [p for p in judge.load_problems() if p.env == "browser"]
SOLVED_PROBLEM = "page_slots"  # the problem the browser solves
LOOPING_PROBLEM = "kv_bytes_per_token"  # the problem whose submission loops forever
RUN_WAIT_S = 120  # loading Python, then a run (the page stops a run after TIMEOUTS["browser"])


def require(tool: str, found: bool, how: str) -> None:
    """Fail in CI (./run installs everything), skip on a machine that lacks the tool."""
    if not found:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is not installed: {how}")
        pytest.skip(f"{tool} is not installed ({how})")


def require_pyodide() -> None:
    require("node", shutil.which("node") is not None, "./run installs it")
    require(
        "pyodide",
        (WEB / "node_modules" / "pyodide" / "pyodide.mjs").is_file(),
        "npm ci --prefix practice/web",
    )


def looping_submission(problem: judge.Problem) -> str:
    """The starter with every `raise NotImplementedError(...)` replaced by an endless loop."""
    starter = (problem.path / "starter.py").read_text()
    looping, count = re.subn(
        r"raise NotImplementedError\(.*\)", "while True:\n        pass", starter
    )
    assert count, f"{problem.slug}'s starter has no NotImplementedError to replace"
    return looping


def problem(slug: str) -> judge.Problem:
    return next(p for p in BROWSER_PROBLEMS if p.slug == slug)


# --- the runner, on this Python ------------------------------------------------------------


def test_runner_reports_the_failing_test_with_its_message_and_line() -> None:
    tests = (
        "import pytest\nfrom submission import double\n\n"
        "def test_example_two():\n    assert double(2) == 4\n\n"
        "@pytest.mark.parametrize('x, want', [(1, 2), (3, 6)])\n"
        "def test_more(x, want):\n    got = double(x)\n"
        "    assert got == want, f'double({x}): expected {want}, got {got}'\n\n"
        "def test_negative_raises():\n    with pytest.raises(ValueError):\n"
        "        double(-1)\n"
    )
    wrong = "def double(x):\n    if x == 3:\n        return 5\n    return 2 * x\n"
    result = runner.run(wrong, tests)
    verdicts = {t["name"]: (t["passed"], t["message"]) for t in result["tests"]}
    assert list(verdicts) == [
        "test_example_two",
        "test_more[1-2]",
        "test_more[3-6]",
        "test_negative_raises",
    ]
    assert verdicts["test_more[3-6]"] == (False, "double(3): expected 6, got 5")
    assert verdicts["test_negative_raises"] == (False, "DID NOT RAISE ValueError")
    assert verdicts["test_example_two"][0] and verdicts["test_more[1-2]"][0]
    samples = runner.run(wrong, tests, samples_only=True)["tests"]
    assert [t["name"] for t in samples] == ["test_example_two"]


def test_runner_points_at_the_line_of_the_submission_that_raised() -> None:
    tests = "from submission import f\n\ndef test_f():\n    assert f() == 1\n"
    result = runner.run("def f():\n    return 1 // 0\n", tests)
    assert result["tests"][0]["message"] == (
        "ZeroDivisionError: integer division or modulo by zero (raised at submission.py:2)"
    )
    broken = runner.run("def f(:\n    pass\n", tests)
    assert broken["error"].startswith("submission.py:1: SyntaxError: ") and not broken["tests"]
    missing = runner.run("def g():\n    return 1\n", tests)
    assert missing["error"].startswith("the tests could not import your code: ImportError")


def test_runner_names_cases_by_their_ids_and_compares_with_approx() -> None:
    tests = (
        "import pytest\nfrom submission import half\n\n"
        "@pytest.mark.parametrize('x', [1, 3], ids=['one', 'three'])\n"
        "@pytest.mark.parametrize('scale', [1.0, 10.0])\n"
        "def test_half(x, scale):\n"
        "    assert half(x * scale) == pytest.approx(x * scale / 2)\n"
    )
    close = runner.run("def half(x):\n    return x / 2 + 1e-9\n", tests)["tests"]
    assert [(t["name"], t["passed"]) for t in close] == [
        ("test_half[1.0-one]", True),
        ("test_half[1.0-three]", True),
        ("test_half[10.0-one]", True),
        ("test_half[10.0-three]", True),
    ]
    off = runner.run("def half(x):\n    return x / 2 + 0.01\n", tests)["tests"]
    assert not any(t["passed"] for t in off)


def test_runner_leaves_pytest_and_the_submission_out_of_sys_modules() -> None:
    real_pytest = sys.modules["pytest"]
    runner.run("def f():\n    return 1\n", "import pytest\nfrom submission import f\n")
    assert sys.modules["pytest"] is real_pytest and "submission" not in sys.modules


# --- every problem on Pyodide under node ---------------------------------------------------


@pytest.mark.slow
def test_every_browser_problem_solution_passes_and_starter_fails_on_pyodide(tmp_path: Path) -> None:
    require_pyodide()
    assert len(BROWSER_PROBLEMS) >= 20, "the browser problems were not found"
    runs = [
        {
            "id": f"{p.slug}/{kind}",
            "submission": submission,
            "tests": (p.path / "test.py").read_text(),
        }
        for p in BROWSER_PROBLEMS
        for kind, submission in (
            ("solution", judge.solution_source(p)),  # with the bodies it takes from the engine
            ("starter", (p.path / "starter.py").read_text()),
        )
    ]
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    started = time.monotonic()
    done = subprocess.run(
        ["node", str(WEB / "check.mjs"), str(tmp_path / "runs.json")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=WEB,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    results = report["results"]
    print(
        f"node check: {len(runs)} runs in {time.monotonic() - started:.1f} s "
        f"(Pyodide loaded in {report['load_seconds']:.1f} s)"
    )
    for p in BROWSER_PROBLEMS:
        solution, starter = results[f"{p.slug}/solution"], results[f"{p.slug}/starter"]
        failed = [t["name"] for t in solution["tests"] if not t["passed"]]
        assert solution["tests"] and not solution["error"] and not failed, (
            f"{p.slug}: the solution fails on Pyodide: {solution['error'] or failed}"
        )
        assert starter["error"] or not all(t["passed"] for t in starter["tests"]), (
            f"{p.slug}: the starter passes on Pyodide"
        )
        ran = {t["name"] for t in solution["tests"]}
        assert set(p.sample_names) <= ran, f"{p.slug}: samples {p.sample_names} did not all run"


# --- the built site in headless Chromium ---------------------------------------------------


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@pytest.fixture(scope="module")
def site(built_site: Path) -> Path:
    """The site with Pyodide vendored into it (shared with the site tests)."""
    require_pyodide()
    return built_site


@pytest.mark.slow
def test_every_browser_problem_has_a_page_built_from_its_files(site: Path) -> None:
    for name in ("pyodide.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json"):
        vendored, package = site / "pyodide" / name, WEB / "node_modules" / "pyodide" / name
        assert vendored.read_bytes() == package.read_bytes(), f"site/pyodide/{name}"
    index = (site / "practice" / "index.html").read_text()
    for p in BROWSER_PROBLEMS:
        page = (site / "practice" / p.slug / "index.html").read_text()
        data = json.loads(re.search(r'class="practice-data">(.*?)</script>', page).group(1))
        assert data["starter"] == (p.path / "starter.py").read_text(), p.slug
        assert data["tests"] == (p.path / "test.py").read_text(), p.slug
        assert all(f"{name}</span>" in page for name in p.sample_names), p.slug
        assert 'class="practice-explanation" hidden' in page, p.slug
        assert f'href="{p.slug}/"' in index and f'data-practice-status="{p.number}"' in index


@pytest.fixture(scope="module")
def site_url(site: Path) -> Iterator[str]:
    """The built site, served on 127.0.0.1 (wasm needs http, not file://)."""
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(site))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def devtools(site_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A headless Chromium with one tab; yields the tab's DevTools websocket URL."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    require("chromium", browser is not None, "./run installs Debian's chromium")
    profile = tmp_path_factory.mktemp("chromium-profile")
    process = subprocess.Popen(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.is_file() or not port_file.read_text().strip():
            assert process.poll() is None and time.monotonic() < deadline, "chromium did not start"
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as response:
            tabs = [t for t in json.load(response) if t["type"] == "page"]
        yield tabs[0]["webSocketDebuggerUrl"]
    finally:
        process.terminate()
        process.wait(timeout=30)


class Tab:
    """Just enough of the DevTools protocol: navigate and evaluate JavaScript."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.next_id = 0

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        await self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:  # skip events until our answer comes
            message = json.loads(await self.socket.recv())
            if message.get("id") == self.next_id:
                assert "error" not in message, message["error"]
                return message["result"]

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
        )
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    async def open(self, url: str) -> None:
        await self.send("Page.navigate", url=url)
        await self.wait_for(
            f"location.href === {json.dumps(url)} && document.readyState === 'complete'", 60
        )

    async def wait_for(self, condition: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not await self.evaluate(f"Boolean({condition})"):
            assert time.monotonic() < deadline, f"timed out waiting for: {condition}"
            await asyncio.sleep(0.2)

    async def run_tests(self, code: str) -> str:
        """Type `code` into the editor, press "Run all tests", wait for the verdict."""
        await self.evaluate(f"""(() => {{
            const editor = document.querySelector('.practice-editor');
            editor.value = {json.dumps(code)};
            editor.dispatchEvent(new Event('input'));
            document.querySelector('.practice-results').dataset.state = 'clicked';
            document.querySelector('button[data-run="all"]').click();
        }})()""")
        state = "document.querySelector('.practice-results').dataset.state"
        await self.wait_for(f"!['clicked', 'running'].includes({state})", RUN_WAIT_S)
        return await self.evaluate(state)


def in_tab(devtools: str, scenario: Any) -> Any:
    import websockets

    async def main() -> Any:
        async with websockets.connect(devtools, max_size=None) as socket:
            return await scenario(Tab(socket))

    return asyncio.run(main())


@pytest.mark.slow
def test_chromium_solves_a_problem_on_its_page_and_the_index_shows_it(
    site_url: str, devtools: str
) -> None:
    solved = problem(SOLVED_PROBLEM)
    page = f"{site_url}/practice/{solved.slug}/"

    async def scenario(tab: Tab) -> None:
        started = time.monotonic()
        await tab.open(page)
        explanation = "document.querySelector('.practice-explanation').hidden"
        assert await tab.evaluate(explanation), "the explanation shows before any run"
        starter = await tab.evaluate("document.querySelector('.practice-editor').value")
        assert starter == (solved.path / "starter.py").read_text()
        status = "document.querySelector('.practice .practice-status').textContent"
        await tab.wait_for(f"{status}.startsWith('Python is ready')", RUN_WAIT_S)
        print(f"Pyodide in the page's worker: {await tab.evaluate(status)}")  # its load time
        assert await tab.run_tests(starter) == "failed"
        print(
            f"page request to first result (loading Python included): "
            f"{time.monotonic() - started:.1f} s"
        )
        assert not await tab.evaluate("document.querySelector('.practice-hint').hidden")
        verdict = await tab.run_tests(judge.solution_source(solved))
        results = await tab.evaluate("document.querySelector('.practice-results').innerText")
        assert verdict == "passed", results
        assert not await tab.evaluate(explanation), "the explanation is still hidden"
        await tab.open(f"{site_url}/practice/")
        status = await tab.evaluate(
            f"document.querySelector('[data-practice-status=\"{solved.number}\"]').textContent"
        )
        assert status == "solved ✓"

    in_tab(devtools, scenario)


@pytest.mark.slow
def test_chromium_stops_an_infinite_loop_and_runs_again_afterwards(
    devtools: str, site_url: str
) -> None:
    looping = problem(LOOPING_PROBLEM)

    async def scenario(tab: Tab) -> None:
        await tab.open(f"{site_url}/practice/{looping.slug}/")
        started = time.monotonic()
        assert await tab.run_tests(looping_submission(looping)) == "stopped"
        results = await tab.evaluate("document.querySelector('.practice-results').innerText")
        assert f"Stopped after {judge.TIMEOUTS['browser']} s" in results
        assert time.monotonic() - started < judge.TIMEOUTS["browser"] + 60
        verdict = await tab.run_tests(judge.solution_source(looping))
        assert verdict == "passed", "the page did not recover after stopping the loop"

    in_tab(devtools, scenario)
