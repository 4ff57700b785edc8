// Opens a node's dashboard in headless Chromium and checks what it shows against the node's
// own /status: every miner of the plan under its stage, each miner's own sample count read
// from that miner's /status, the node's reachability and each miner's path (direct), the
// held-out loss curve gaining a point as an epoch passes, and the latest held-out loss in nats
// per token and bits per byte. Leaves a screenshot. Used by the dashboard test
// (tests/tests/dashboard.rs); exits non-zero saying what was not seen.
//
// Usage: node check.mjs <dashboard url> <expected.json> <screenshot.png>
//   expected.json: {"stage_map": [[peer, ...], ...]}
import { readFileSync } from "node:fs";
import { chromium } from "playwright-core";

const [url, expectedPath, screenshot] = process.argv.slice(2);
const expected = JSON.parse(readFileSync(expectedPath, "utf8"));
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
  ],
});
let failed = null;
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  await page.goto(url);
  for (const [stage, miners] of expected.stage_map.entries()) {
    for (const peer of miners) {
      await page
        .locator(`[data-stage="${stage}"] [data-peer="${peer}"]`)
        .waitFor({ timeout: 30000 });
    }
  }
  // Each miner's own count, read from its /status (the peers it announced).
  for (const peer of expected.stage_map.flat()) {
    await page.waitForFunction(
      (p) => {
        const cell = document.querySelector(`#miners tr[data-peer="${p}"] td.served`);
        return cell && /^[1-9][0-9]*$/.test(cell.textContent);
      },
      peer,
      { timeout: 60000, polling: 500 },
    );
  }
  // The node's reachability (AutoNAT dials it back on 127.0.0.1: public) and how it reaches
  // each miner (all connections direct on one host).
  await page.waitForFunction(
    () => /^reachability public · /.test(document.getElementById("reach").textContent),
    null,
    { timeout: 60000, polling: 500 },
  );
  for (const peer of expected.stage_map.flat()) {
    await page
      .locator(`#peers tr[data-peer="${peer}"] td.path`, { hasText: "direct" })
      .waitFor({ timeout: 30000 });
  }
  const points = () => page.locator("circle.point-val").count();
  const before = await points();
  await page.waitForFunction(
    (n) => document.querySelectorAll("circle.point-val").length > n,
    before,
    { timeout: 120000, polling: 500 },
  );
  const after = await points();
  // The latest held-out loss, also in bits per byte (the validator holds the run's data).
  await page.waitForFunction(
    () => /nats\/token · [0-9.]+ bits\/byte$/.test(document.getElementById("val-latest").textContent),
    null,
    { timeout: 10000, polling: 500 },
  );
  const heldOut = await page.locator("#val-latest").textContent();
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log(
    `DASHBOARD ok stages=${expected.stage_map.length} miners=${expected.stage_map.flat().length} val_points=${before}->${after} held_out="${heldOut}" screenshot=${screenshot}`,
  );
} catch (e) {
  failed = e;
}
await browser.close();
if (failed) {
  console.error(`DASHBOARD failed: ${failed.message}`);
  process.exit(1);
}
