// Run practice tests on the vendored Pyodide under node, as the site's Web Worker does.
//
//   node practice/web/check.mjs RUNS.json
//
// RUNS.json is a list of {"id", "submission", "tests", "samples_only"} (sources, not paths);
// one interpreter runs them all in a row through runner.py. Prints one JSON object to stdout:
// {"load_seconds": s, "results": {id: runner.py's result}}. The CI test that every browser
// problem's solution passes and its starter fails (tests/test_browser_practice.py) uses it.
import { readFile } from "node:fs/promises";
import { loadPyodide } from "pyodide";

const [runsPath] = process.argv.slice(2);
if (!runsPath) {
  console.error("usage: node practice/web/check.mjs RUNS.json");
  process.exit(2);
}
const runs = JSON.parse(await readFile(runsPath, "utf8"));
const started = performance.now();
const pyodide = await loadPyodide();
pyodide.runPython(await readFile(new URL("./runner.py", import.meta.url), "utf8"));
const runJson = pyodide.globals.get("run_json");
const loadSeconds = (performance.now() - started) / 1000;
const results = {};
for (const run of runs) {
  results[run.id] = JSON.parse(runJson(run.submission, run.tests, Boolean(run.samples_only)));
}
console.log(JSON.stringify({ load_seconds: loadSeconds, results }));
