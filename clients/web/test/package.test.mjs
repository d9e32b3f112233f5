// The npm package as an app gets it: package.json's entry points and peers, the names each entry point exports
// against its declarations (types/), a core free of Node and DOM calls, and the files `npm pack` puts in the
// tarball. Installing the tarball in a fresh project and answering a question: tests/test_web_client.py (it needs
// a bundle).
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const CLIENT = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const PACKAGE = JSON.parse(readFileSync(join(CLIENT, "package.json"), "utf8"));
const ENTRY_POINTS = { ".": "index", "./node": "node", "./browser": "browser" };
const RUNTIMES = ["onnxruntime-node", "onnxruntime-web"];

test("package.json: a public, licensed package with a core, a Node and a browser entry point", () => {
  assert.equal(PACKAGE.private, undefined);
  assert.match(PACKAGE.name, /^(@[a-z0-9-]+\/)?[a-z0-9-]+$/);
  assert.match(PACKAGE.version, /^\d+\.\d+\.\d+$/);
  assert.equal(PACKAGE.license, "Apache-2.0");
  assert.equal(PACKAGE.type, "module");
  for (const [entry, name] of Object.entries(ENTRY_POINTS)) {
    // "types" first: TypeScript takes the first condition that matches.
    assert.deepEqual(PACKAGE.exports[entry], { types: `./types/${name}.d.ts`, default: `./src/${name}.js` }, entry);
    assert.ok(existsSync(join(CLIENT, "src", `${name}.js`)) && existsSync(join(CLIENT, "types", `${name}.d.ts`)));
  }
});

test("the onnxruntime packages are optional peers (the app brings its runtime) and dev dependencies", () => {
  assert.deepEqual(PACKAGE.dependencies ?? {}, {});
  for (const runtime of RUNTIMES) {
    assert.deepEqual(PACKAGE.peerDependenciesMeta[runtime], { optional: true }, runtime);
    // The version the tests run is the peer range's floor.
    assert.equal(PACKAGE.peerDependencies[runtime], `^${PACKAGE.devDependencies[runtime]}`, runtime);
  }
});

/** The value names a declaration file exports (types and interfaces left out), following `export *`. */
function declaredValues(file) {
  const text = readFileSync(file, "utf8");
  const names = new Set();
  for (const match of text.matchAll(/^export declare (?:class|function|const|let) (\w+)/gm)) names.add(match[1]);
  for (const match of text.matchAll(/^export \* from "\.\/(\w+)\.js";/gm)) {
    for (const name of declaredValues(join(dirname(file), `${match[1]}.d.ts`))) names.add(name);
  }
  return names;
}

test("each entry point, imported by the package's name, exports exactly the values its declarations name", async () => {
  for (const [entry, name] of Object.entries(ENTRY_POINTS)) {
    const specifier = entry === "." ? PACKAGE.name : `${PACKAGE.name}/${entry.slice(2)}`;
    const module = await import(specifier);
    assert.deepEqual(Object.keys(module).sort(), [...declaredValues(join(CLIENT, "types", `${name}.d.ts`))].sort(), entry);
  }
  const core = await import(PACKAGE.name);
  for (const error of [core.BundleError, core.TokenizerError]) assert.equal(new error("x").name, error.name);
});

/** The files a module imports, transitively, within src/. */
function importedFiles(file, seen = new Set()) {
  seen.add(file);
  for (const match of readFileSync(file, "utf8").matchAll(/^(?:import|export) .* from "(\.\/[\w.]+)";/gm)) {
    const imported = resolve(dirname(file), match[1]);
    if (!seen.has(imported)) importedFiles(imported, seen);
  }
  return seen;
}

test("the core entry point (React Native's) uses no Node module, DOM, globals or fetch", () => {
  const files = [...importedFiles(join(CLIENT, "src", "index.js"))];
  assert.deepEqual(files.map((file) => file.slice(CLIENT.length + 1)).sort(),
    ["src/answerer.js", "src/index.js", "src/squad.js", "src/tokenizer.js"]);
  for (const file of files) {
    const code = readFileSync(file, "utf8").replace(/^\s*(\/\/|\*|\/\*).*$/gm, ""); // comments may name them
    assert.doesNotMatch(code, /from "node:|import\(|\b(process|document|navigator|globalThis|fetch|require|Buffer)\b/, file);
  }
});

test("npm pack puts the sources, the declarations, README, LICENSE and package.json in the tarball, nothing else", () => {
  const [packed] = JSON.parse(execFileSync("npm", ["pack", "--dry-run", "--json", "--ignore-scripts"], {
    cwd: CLIENT, encoding: "utf8", stdio: ["ignore", "pipe", "ignore"],
  }));
  const files = packed.files.map((file) => file.path).sort();
  const expected = ["LICENSE", "README.md", "package.json",
    ...["answerer", "browser", "index", "node", "squad", "tokenizer"].map((name) => `src/${name}.js`),
    ...Object.values(ENTRY_POINTS).map((name) => `types/${name}.d.ts`)].sort();
  assert.deepEqual(files, expected);
  assert.equal(packed.name, PACKAGE.name);
  // The package's LICENSE is the repository's.
  assert.equal(readFileSync(join(CLIENT, "LICENSE"), "utf8"), readFileSync(join(CLIENT, "..", "..", "LICENSE"), "utf8"));
});
