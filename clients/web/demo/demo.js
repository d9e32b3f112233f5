// The demo page: load the bundle served beside this page, answer in the page with onnxruntime-web.
import * as ort from "../node_modules/onnxruntime-web/dist/ort.wasm.min.mjs";
import { codePoints, loadBundleFromUrl } from "../src/browser.js";

const $ = (id) => document.getElementById(id);
ort.env.wasm.wasmPaths = new URL("../node_modules/onnxruntime-web/dist/", import.meta.url).href;

function showHighlighted(context, start, end) {
  // start/end count code points (as the Python answerer does); the DOM wants string pieces.
  const chars = codePoints(context);
  const view = $("highlighted");
  view.replaceChildren();
  view.append(chars.slice(0, start).join(""));
  if (end > start) {
    const mark = document.createElement("mark");
    mark.textContent = chars.slice(start, end).join("");
    view.append(mark);
  }
  view.append(chars.slice(end).join(""));
}

async function main() {
  const { answerer, qaConfig, modelBytes } = await loadBundleFromUrl(ort, "bundle/", { threads: 1 });
  const sizeMb = (modelBytes / 1e6).toFixed(2);
  $("model-size").textContent = `${qaConfig.onnx.model}, ${sizeMb} MB`;
  $("status").textContent =
    `Model ${qaConfig.onnx.model} (${sizeMb} MB) loaded: onnxruntime-web ${ort.env.versions.web}, WebAssembly, 1 thread; ` +
    `windows of ${qaConfig.max_seq_length} tokens, stride ${qaConfig.doc_stride}.`;
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
