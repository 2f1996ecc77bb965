// The Web Worker that runs practice tests: Python (Pyodide, served by this site) runs here so
// the page stays responsive, and the page can terminate() the worker when a run takes too long.
//
// Messages in:  {id, submission, tests, samplesOnly}
// Messages out: {type: "ready", seconds} once Python is loaded,
//               {type: "result", id, result} per run (runner.py's result),
//               {type: "error", message} if Python could not be loaded.
import { loadPyodide } from "../../pyodide/pyodide.mjs";

async function load() {
  const started = performance.now();
  const pyodide = await loadPyodide({ indexURL: new URL("../../pyodide/", import.meta.url).href });
  const runner = await fetch(new URL("./runner.py", import.meta.url));
  if (!runner.ok) throw new Error(`runner.py: HTTP ${runner.status}`);
  pyodide.runPython(await runner.text());
  postMessage({ type: "ready", seconds: (performance.now() - started) / 1000 });
  return pyodide.globals.get("run_json");
}

const runJson = load();
runJson.catch((error) => postMessage({ type: "error", message: String(error) }));

onmessage = async ({ data }) => {
  const run = await runJson;
  let result;
  try {
    result = JSON.parse(run(data.submission, data.tests, data.samplesOnly));
  } catch (error) { // runner.py reports the student's errors itself: this is anything else
    result = { error: `the tests could not run: ${error.message}`, tests: [], output: "" };
  }
  postMessage({ type: "result", id: data.id, result });
};
