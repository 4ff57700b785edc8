// The dashboard against a peer whose HTTP server trickles its body: the page is served from
// the node's own assets by a stand-in for the node (its /status names one miner whose
// announced server sends headers at once and then one byte of body every 200 ms, never
// ending), and headless Chromium must keep following /status — the epoch it shows must change
// at least three times within 25 s — and list an unverified peer without a link. A page whose
// fetch timeout covered only the headers would wait on that body for ever and stop drawing.
// Used by tests/tests/dashboard.rs; exits non-zero saying what was not seen.
//
// Usage: node trickle.mjs <dashboard assets dir> <screenshot.png>
import { createServer } from "node:http";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const [assets, screenshot] = process.argv.slice(2);
const listen = (server) =>
  new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(server.address().port)));

// The miner's server: headers now, then a body that never ends.
let trickled = 0;
const trickler = createServer((req, res) => {
  trickled += 1;
  res.writeHead(200, { "content-type": "application/json", "access-control-allow-origin": "*" });
  res.write('{"peer_id":"miner-1",');
  const timer = setInterval(() => res.write(" "), 200);
  res.on("close", () => clearInterval(timer));
});
const minerPort = await listen(trickler);

// The node: its assets as they are, and a /status whose epoch grows with every read.
let epoch = 0;
const files = {
  "/": ["index.html", "text/html"],
  "/dashboard.js": ["dashboard.js", "text/javascript"],
  "/dashboard.css": ["dashboard.css", "text/css"],
};
const node = createServer((req, res) => {
  if (req.url === "/status") {
    epoch += 1;
    res.writeHead(200, { "content-type": "application/json" });
    res.end(
      JSON.stringify({
        peer_id: "validator-0",
        role: "validator",
        epoch,
        stage_map: [["miner-1"]],
        live_peers: ["miner-1", "stranger-1"],
        peers: [
          { peer_id: "miner-1", kind: "miner" },
          { peer_id: "stranger-1", kind: "unverified" },
        ],
        peer_dashboards: { "miner-1": `http://127.0.0.1:${minerPort}` },
        epochs: [],
      }),
    );
    return;
  }
  const file = files[req.url];
  if (!file) {
    res.writeHead(404).end();
    return;
  }
  res.writeHead(200, { "content-type": `${file[1]}; charset=utf-8` });
  res.end(readFileSync(join(assets, file[0])));
});
const nodePort = await listen(node);

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
});
let failed = null;
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  await page.goto(`http://127.0.0.1:${nodePort}/`);
  const seen = new Set();
  const deadline = Date.now() + 25000;
  while (seen.size < 3 && Date.now() < deadline) {
    const shown = await page.locator("#epoch").textContent();
    if (/^[0-9]+$/.test(shown)) seen.add(shown);
    await page.waitForTimeout(250);
  }
  if (seen.size < 3) {
    throw new Error(
      `the page stopped following /status: epochs shown ${JSON.stringify([...seen])}, the miner's server was asked ${trickled} time(s)`,
    );
  }
  if (trickled < 1) throw new Error("the page never asked the miner's server");
  const kind = await page.locator('#peers tr[data-peer="stranger-1"] td.kind').textContent({ timeout: 5000 });
  if (kind !== "unverified") throw new Error(`the stranger is shown as ${JSON.stringify(kind)}`);
  const links = await page.locator('#peers tr[data-peer="stranger-1"] a').count();
  if (links !== 0) throw new Error("the stranger is shown with a link");
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log(`TRICKLE ok epochs=${[...seen].join(",")} trickled=${trickled}`);
} catch (e) {
  failed = e;
}
await browser.close();
trickler.closeAllConnections();
node.closeAllConnections();
trickler.close();
node.close();
if (failed) {
  console.error(`TRICKLE failed: ${failed.message}`);
  process.exit(1);
}
