// Headless Chromium for the scripts that drive a page (browser-check.mjs, bench.mjs): the system's Chromium
// (CHROMIUM_PATH, default /usr/bin/chromium), never a download, with a throwaway profile under `scratch`.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import puppeteer from "puppeteer-core";

export const CHROMIUM_PATH = process.env.CHROMIUM_PATH || "/usr/bin/chromium";
const CHROMIUM_FLAGS = [
  "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
];
export const TIMEOUT_MS = 60_000;

export async function launchChromium(scratch) {
  if (!existsSync(CHROMIUM_PATH)) {
    throw new Error(`${CHROMIUM_PATH}: no Chromium there (apt-get install chromium, or set CHROMIUM_PATH)`);
  }
  return puppeteer.launch({
    executablePath: CHROMIUM_PATH, args: [...CHROMIUM_FLAGS, `--user-data-dir=${join(scratch, "profile")}`],
    headless: true, protocolTimeout: 10 * TIMEOUT_MS,
  });
}

/** What the page says about its threads: whether it is cross-origin isolated and how many cores it sees. */
export function pageIsolation(page) {
  return page.evaluate(() => ({
    cross_origin_isolated: self.crossOriginIsolated, hardware_concurrency: navigator.hardwareConcurrency,
  }));
}

/**
 * Peak resident memory in MiB of the renderer processes (where a page's WebAssembly memory lives), from
 * /proc/PID/status VmHWM; null where the process list or /proc cannot be read (not Linux).
 */
export async function rendererPeakRssMib(browser) {
  try {
    const cdp = await browser.target().createCDPSession();
    const { processInfo } = await cdp.send("SystemInfo.getProcessInfo");
    const peaks = processInfo.filter((process) => process.type === "renderer").map((process) => {
      const match = /^VmHWM:\s+(\d+) kB/m.exec(readFileSync(`/proc/${process.id}/status`, "utf8"));
      return match ? Number(match[1]) : 0;
    });
    return peaks.length ? Math.round(Math.max(...peaks) / 102.4) / 10 : null;
  } catch {
    return null;
  }
}
