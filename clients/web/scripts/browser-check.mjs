// Ask questions in the demo page in headless Chromium, as a user would, and record the answers it shows.
//   node scripts/browser-check.mjs --bundle DIR --questions FILE --out FILE --screenshot FILE.png
//        [--threads N] [--no-isolation]
// FILE: a JSON list of {id, question, context}. The bundle is copied to a temporary folder and served on
// 127.0.0.1 by serve-demo.mjs (cross-origin isolated unless --no-isolation); Chromium is the system one
// (CHROMIUM_PATH, default /usr/bin/chromium), never a download. --threads N opens the page with ?threads=N
// (default: the page's own choice, as many as the browser allows). The output holds {answers: {id: text
// shown}, latency_ms: {id: latency shown}, status, cross_origin_isolated, hardware_concurrency, threads (the
// count onnxruntime-web runs), workers (the page's workers: the WebAssembly threads but the page's own), user_agent}.
import { mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { launchChromium, pageIsolation, TIMEOUT_MS } from "./chromium.mjs";
import { copyBundle, serve } from "./serve-demo.mjs";

async function askAll(page, questions) {
  const answers = {};
  const latencies = {};
  for (const [index, item] of questions.entries()) {
    await page.$eval("#context", (element, value) => { element.value = value; }, item.context);
    await page.$eval("#question", (element, value) => { element.value = value; }, item.question);
    await page.click("#ask");
    await page.waitForFunction((count) => document.body.dataset.answered === String(count), { timeout: TIMEOUT_MS }, index + 1);
    answers[item.id] = await page.$eval("#answer", (element) => element.textContent);
    latencies[item.id] = await page.$eval("#latency", (element) => element.textContent);
  }
  return { answers, latencies };
}

async function main() {
  const { values } = parseArgs({
    options: {
      bundle: { type: "string" }, questions: { type: "string" }, out: { type: "string" }, screenshot: { type: "string" },
      threads: { type: "string" }, "no-isolation": { type: "boolean", default: false },
    },
  });
  if (!values.bundle || !values.questions || !values.out || !values.screenshot) {
    console.error("error: --bundle, --questions, --out and --screenshot are required");
    process.exit(2);
  }
  const questions = JSON.parse(readFileSync(values.questions, "utf8"));
  const scratch = mkdtempSync(join(tmpdir(), "qa-demo-"));
  const server = await serve({ "/demo/bundle/": join(scratch, "bundle") }, 0, { isolation: !values["no-isolation"] });
  let browser;
  try {
    copyBundle(values.bundle, join(scratch, "bundle"));
    browser = await launchChromium(scratch);
    const page = await browser.newPage();
    await page.setViewport({ width: 1000, height: 900 });
    const pageErrors = [];
    page.on("pageerror", (error) => pageErrors.push(error.message));
    const query = values.threads === undefined ? "" : `?threads=${encodeURIComponent(values.threads)}`;
    const url = `http://127.0.0.1:${server.address().port}/demo/${query}`;
    await page.goto(url, { waitUntil: "load", timeout: TIMEOUT_MS });
    await page.waitForFunction(() => document.body.dataset.ready === "true" || document.body.dataset.error,
      { timeout: TIMEOUT_MS });
    const loadError = await page.evaluate(() => document.body.dataset.error);
    if (loadError) throw new Error(`the demo page failed to load the bundle: ${loadError}`);
    const { answers, latencies } = await askAll(page, questions);
    await page.screenshot({ path: values.screenshot, fullPage: true });
    const result = {
      url, answers, latency_ms: latencies, status: await page.$eval("#status", (element) => element.textContent),
      model_size: await page.$eval("#model-size", (element) => element.textContent),
      ...(await pageIsolation(page)),
      threads: Number(await page.evaluate(() => document.body.dataset.threads)), workers: page.workers().length,
      user_agent: await browser.userAgent(), page_errors: pageErrors,
    };
    writeFileSync(`${values.out}.partial`, JSON.stringify(result, null, 1));
    renameSync(`${values.out}.partial`, values.out);
  } finally {
    if (browser) await browser.close();
    server.close();
    rmSync(scratch, { recursive: true, force: true });
  }
}

main().catch((error) => {
  console.error(`error: ${error.message}`);
  process.exit(1);
});
