// Latency of one ONNX question-answering model in onnxruntime-node, onnxruntime-web (WebAssembly) in Node, or
// onnxruntime-web in headless Chromium: batch 1, every token attended, p50/p90 over --runs timed runs after
// --warmup untimed ones (bench/latency.js, the same code in Node and in the page), at --threads threads.
//   node scripts/bench.mjs --model FILE --backend node|web|chromium --lengths 128,384 --vocab-size N
//        [--max-positions N] [--runs 20] [--warmup 3] [--threads 1] [--no-isolation] --out FILE
// chromium: the page bench/ served on 127.0.0.1 by serve-demo.mjs, cross-origin isolated (unless --no-isolation)
// so that WebAssembly threads run; a page that runs fewer threads than asked is an error, never a figure. Lengths beyond
// --max-positions get null (the model has no positions for them). The output holds {backend, runtime, node,
// threads, latency_ms: {seqL: {threadsT: {p50, p90}} | null}, peak_rss_mib} (chromium: the renderer's peak, and
// browser, the Chromium version). runtime names the runtime; the thread count is in the latency keys.
import { mkdtempSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, dirname, join } from "node:path";
import { parseArgs } from "node:util";
import { timeLengths } from "../bench/latency.js";
import { onnxRuntime, sessionOptions } from "../src/node.js";
import { serve } from "./serve-demo.mjs";

async function timeInNode(settings) {
  const ort = await onnxRuntime(settings.backend);
  const model = await readFile(settings.model);
  const session = await ort.InferenceSession.create(new Uint8Array(model), sessionOptions(ort, settings.backend, settings.threads));
  const latency = await timeLengths(ort, session, settings);
  const runtime = settings.backend === "web"
    ? `onnxruntime-web ${ort.env.versions.web} (WebAssembly, in Node ${process.versions.node})`
    : `onnxruntime-node ${ort.env.versions.node} (native CPU)`;
  return {
    runtime, latency_ms: latency,
    peak_rss_mib: Math.round(process.resourceUsage().maxRSS / 102.4) / 10, // maxRSS is in KiB
  };
}

async function timeInChromium(settings) {
  const { launchChromium, rendererPeakRssMib, TIMEOUT_MS } = await import("./chromium.mjs"); // puppeteer only here
  const scratch = mkdtempSync(join(tmpdir(), "qa-bench-"));
  const server = await serve({ "/model/": dirname(settings.model) }, 0, { isolation: settings.isolation });
  let browser;
  try {
    browser = await launchChromium(scratch);
    const page = await browser.newPage();
    const pageErrors = [];
    page.on("pageerror", (error) => pageErrors.push(error.message));
    const origin = `http://127.0.0.1:${server.address().port}`;
    await page.goto(`${origin}/bench/`, { waitUntil: "load", timeout: TIMEOUT_MS });
    await page.waitForFunction(() => document.body.dataset.ready === "true", { timeout: TIMEOUT_MS }).catch(() => {
      throw new Error(`the latency page did not load: ${pageErrors.join("; ") || "no error reported"}`);
    });
    const result = await page.evaluate((pageSettings) => window.runBenchmark(pageSettings), {
      modelUrl: `${origin}/model/${encodeURIComponent(basename(settings.model))}`, lengths: settings.lengths,
      vocabSize: settings.vocabSize, maxPositions: Number.isFinite(settings.maxPositions) ? settings.maxPositions : null,
      runs: settings.runs, warmup: settings.warmup, threads: settings.threads,
    });
    const version = (await browser.version()).replace(/^(Headless)?Chrome\//, "");
    const isolation = result.cross_origin_isolated ? "cross-origin isolated" : "not cross-origin isolated";
    return {
      runtime: `onnxruntime-web ${result.version} (WebAssembly, in Chromium ${version}, ${isolation})`,
      browser: `Chromium ${version}`, latency_ms: result.latency_ms, peak_rss_mib: await rendererPeakRssMib(browser),
    };
  } finally {
    if (browser) await browser.close();
    server.close();
    rmSync(scratch, { recursive: true, force: true });
  }
}

async function main() {
  const { values } = parseArgs({
    options: {
      model: { type: "string" }, backend: { type: "string", default: "node" }, lengths: { type: "string", default: "128,384" },
      "vocab-size": { type: "string" }, "max-positions": { type: "string" }, runs: { type: "string", default: "20" },
      warmup: { type: "string", default: "3" }, threads: { type: "string", default: "1" }, out: { type: "string" },
      "no-isolation": { type: "boolean", default: false },
    },
  });
  if (!values.model || !values.out || !values["vocab-size"]) {
    console.error("error: --model FILE, --vocab-size N and --out FILE are required");
    process.exit(2);
  }
  if (!["node", "web", "chromium"].includes(values.backend)) {
    console.error(`error: --backend ${values.backend}: expected node, web or chromium`);
    process.exit(2);
  }
  const settings = {
    model: values.model, backend: values.backend, lengths: values.lengths.split(",").map(Number),
    vocabSize: Number(values["vocab-size"]), runs: Number(values.runs), warmup: Number(values.warmup),
    threads: Number(values.threads), maxPositions: values["max-positions"] ? Number(values["max-positions"]) : Infinity,
    isolation: !values["no-isolation"],
  };
  const timed = settings.backend === "chromium" ? await timeInChromium(settings) : await timeInNode(settings);
  const result = { backend: settings.backend, node: process.versions.node, threads: settings.threads, ...timed };
  writeFileSync(`${values.out}.partial`, JSON.stringify(result, null, 1));
  renameSync(`${values.out}.partial`, values.out);
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((error) => {
    console.error(`error: ${error.message}`);
    process.exit(1);
  });
}
