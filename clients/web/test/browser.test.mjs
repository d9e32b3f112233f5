// The page's thread choice.
import assert from "node:assert/strict";
import { test } from "node:test";
import { defaultThreads } from "../src/browser.js";

test("a page asks for every core only when it is cross-origin isolated", () => {
  assert.equal(defaultThreads({ crossOriginIsolated: true, navigator: { hardwareConcurrency: 8 } }), 8);
  assert.equal(defaultThreads({ crossOriginIsolated: false, navigator: { hardwareConcurrency: 8 } }), 1);
  assert.equal(defaultThreads({ crossOriginIsolated: true, navigator: {} }), 1);
  assert.equal(defaultThreads({}), 1);
});
