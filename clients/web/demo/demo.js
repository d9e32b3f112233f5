// The demo page: load the bundle served beside this page, answer in the page with onnxruntime-web.
import * as ort from "../node_modules/onnxruntime-web/dist/ort.wasm.min.mjs";
import { defaultThreads, loadBundleFromUrl } from "../src/browser.js";

const $ = (id) => document.getElementById(id);
ort.env.wasm.wasmPaths = new URL("../node_modules/onnxruntime-web/dist/", import.meta.url).href;

function showHighlighted(context, start, end) {
  // start/end are UTF-16 indices, what String.prototype.slice takes.
  const view = $("highlighted");
  view.replaceChildren();
  view.append(context.slice(0, start));
  if (end > start) {
    const mark = document.createElement("mark");
    mark.textContent = context.slice(start, end);
    view.append(mark);
  }
  view.append(context.slice(end));
}

/** The WebAssembly threads asked for: ?threads=N in the page's URL, else as many as the browser allows. */
function requestedThreads() {
  const value = new URLSearchParams(location.search).get("threads");
  if (value === null) return defaultThreads();
  if (!/^[1-9][0-9]*$/.test(value)) throw new Error(`threads=${value} in the page's URL: expected a whole number of at least 1`);
  return Number(value);
}

function threadsText(threads) {
  const isolation = crossOriginIsolated
    ? "cross-origin isolated"
    : "not cross-origin isolated, so one thread: the server must send Cross-Origin-Opener-Policy and Cross-Origin-Embedder-Policy";
  return `${threads} thread${threads === 1 ? "" : "s"} (${isolation})`;
}

async function main() {
  const { answerer, qaConfig, modelBytes, threads } = await loadBundleFromUrl(ort, "bundle/", { threads: requestedThreads() });
  const sizeMb = (modelBytes / 1e6).toFixed(2);
  $("model-size").textContent = `${qaConfig.onnx.model}, ${sizeMb} MB`;
  $("status").textContent =
    `Model ${qaConfig.onnx.model} (${sizeMb} MB) loaded: onnxruntime-web ${ort.env.versions.web}, WebAssembly, ` +
    `${threadsText(threads)}; windows of ${qaConfig.max_seq_length} tokens, stride ${qaConfig.doc_stride}.`;
  document.body.dataset.threads = String(threads);
  $("ask").disabled = false;

  async function ask() {
    $("ask").disabled = true;
    try {
      const context = $("context").value;
      const started = performance.now();
      const result = await answerer.answer($("question").value, context, 5);
      const milliseconds = performance.now() - started;
      $("answer").textContent = result.answer || "(no answer found)";
      $("score").textContent = result.score === null ? "" : `score ${result.score.toFixed(2)}`;
      $("latency").textContent = `${milliseconds.toFixed(1)} ms`;
      $("windows").textContent = `${result.windows} window${result.windows === 1 ? "" : "s"}`;
      showHighlighted(context, result.start, result.end);
      $("n-best").replaceChildren(...result.nBest.slice(1).map((candidate) => {
        const item = document.createElement("li");
        item.textContent = `${candidate.text} (score ${candidate.score.toFixed(2)})`;
        return item;
      }));
      $("result").hidden = false;
      document.body.dataset.answered = String(Number(document.body.dataset.answered ?? 0) + 1);
    } catch (error) {
      $("status").textContent = `Error: ${error.message}`;
      $("status").className = "error";
    } finally {
      $("ask").disabled = false;
    }
  }
  $("ask").addEventListener("click", ask);
  $("question").addEventListener("keydown", (event) => { if (event.key === "Enter") ask(); });
  document.body.dataset.ready = "true";
}

main().catch((error) => {
  $("status").textContent = `Error: ${error.message}`;
  $("status").className = "error";
  document.body.dataset.error = error.message;
});
