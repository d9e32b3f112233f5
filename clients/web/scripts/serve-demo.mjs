// Copy an app bundle beside the demo page and serve the page on 127.0.0.1 (nothing leaves this machine).
//   npm run demo -- --bundle ../../artifacts/bundle [--port 8080] [--bundle-copy DIR] [--no-isolation]
// The page is at http://127.0.0.1:PORT/demo/ (?threads=N sets its WebAssembly threads); --port 0 picks a free
// port. The first line printed is "serving URL". The copy holds qa_config.json, the tokenizer files, the ONNX
// model and manifest.json. Every response makes the page cross-origin isolated (ISOLATION_HEADERS), which
// WebAssembly threads need; --no-isolation leaves the headers out, to see the page fall back to one thread.
import { copyFileSync, createReadStream, existsSync, mkdirSync, readFileSync, renameSync, rmSync, statSync } from "node:fs";
import { createServer } from "node:http";
import { dirname, extname, join, normalize, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const CLIENT_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const MIME_TYPES = {
  ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".mjs": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8", ".json": "application/json; charset=utf-8", ".txt": "text/plain; charset=utf-8",
  ".wasm": "application/wasm", ".onnx": "application/octet-stream", ".ort": "application/octet-stream",
  ".png": "image/png", ".svg": "image/svg+xml",
};

/** Copy the files the page reads from `bundleDir` into `target` (replaced whole, via a temporary folder). */
export function copyBundle(bundleDir, target) {
  const qaConfigPath = join(bundleDir, "qa_config.json");
  if (!existsSync(qaConfigPath)) throw new Error(`${qaConfigPath}: missing (not an app bundle?)`);
  const qaConfig = JSON.parse(readFileSync(qaConfigPath, "utf8"));
  const names = ["qa_config.json", qaConfig.tokenizer?.file, qaConfig.tokenizer?.vocab, qaConfig.onnx?.model, "manifest.json"];
  const staging = `${target}.partial`;
  rmSync(staging, { recursive: true, force: true });
  mkdirSync(staging, { recursive: true });
  for (const name of names.filter(Boolean)) {
    const source = join(bundleDir, name);
    if (!existsSync(source)) throw new Error(`${source}: missing (named in ${qaConfigPath})`);
    copyFileSync(source, join(staging, name));
  }
  rmSync(target, { recursive: true, force: true });
  renameSync(staging, target);
}

// Cross-origin isolation: without it the browser withholds SharedArrayBuffer, and onnxruntime-web runs one
// WebAssembly thread whatever numThreads says. Everything the pages load comes from this server (same origin).
export const ISOLATION_HEADERS = {
  "Cross-Origin-Opener-Policy": "same-origin",
  "Cross-Origin-Embedder-Policy": "require-corp",
};

/**
 * A static server of the client folder on 127.0.0.1, with each URL prefix of `mounts` ("/demo/bundle/": a
 * folder) mapped to its folder. `isolation: false` leaves out the cross-origin isolation headers.
 */
export function serve(mounts, port, { isolation = true } = {}) {
  const server = createServer((request, response) => {
    const path = decodeURIComponent(new URL(request.url, "http://127.0.0.1").pathname);
    let root = CLIENT_DIR;
    let relative = path;
    for (const [prefix, folder] of Object.entries(mounts)) {
      if (path.startsWith(prefix)) {
        root = resolve(folder);
        relative = path.slice(prefix.length);
        break;
      }
    }
    let file = resolve(root, "." + sep + normalize(relative));
    if (file !== root && !file.startsWith(root + sep)) {
      response.writeHead(403).end();
      return;
    }
    if (existsSync(file) && statSync(file).isDirectory()) file = join(file, "index.html");
    if (!existsSync(file)) {
      response.writeHead(404).end();
      return;
    }
    response.writeHead(200, {
      "Content-Type": MIME_TYPES[extname(file)] ?? "application/octet-stream", "Cache-Control": "no-store",
      ...(isolation ? ISOLATION_HEADERS : {}),
    });
    createReadStream(file).pipe(response);
  });
  return new Promise((resolvePromise) => server.listen(port, "127.0.0.1", () => resolvePromise(server)));
}

async function main() {
  const { values } = parseArgs({
    options: {
      bundle: { type: "string" }, port: { type: "string", default: "8080" },
      "bundle-copy": { type: "string", default: join(CLIENT_DIR, "demo", "bundle") },
      "no-isolation": { type: "boolean", default: false },
    },
  });
  if (!values.bundle) {
    console.error("error: --bundle DIR is required (the folder written by the pipeline's bundle rule)");
    process.exit(2);
  }
  const bundleCopy = resolve(values["bundle-copy"]);
  try {
    copyBundle(resolve(values.bundle), bundleCopy);
  } catch (error) {
    console.error(`error: ${error.message}`);
    process.exit(2);
  }
  const server = await serve({ "/demo/bundle/": bundleCopy }, Number(values.port), { isolation: !values["no-isolation"] });
  console.log(`serving http://127.0.0.1:${server.address().port}/demo/`);
}

if (import.meta.url === `file://${process.argv[1]}`) main();
