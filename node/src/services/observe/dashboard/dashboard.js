// The node's dashboard: follows GET /status once a second and draws what the node knows of
// the run, and the /status of every validator and miner of the run whose HTTP server the node
// offers (their own counts; the node offers no other peer's). No library, no build step: the
// node serves this file as it is. Everything shown is set as text, never as HTML: a peer's
// status is not trusted. Every fetch is bounded in time as a whole, its body included, so a
// server that trickles its answer cannot hold the page.
"use strict";

// The latest /status of each peer that announced one (peer id -> status).
const peerStatus = new Map();

// How long one fetch may take, headers and body together.
const OWN_TIMEOUT_MS = 5000;
const PEER_TIMEOUT_MS = 2000;

// GET `url` as JSON within `ms`: the abort covers reading the body as well as the headers.
async function fetchJson(url, ms) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), ms);
  try {
    const response = await fetch(url, { cache: "no-store", signal: controller.signal });
    if (!response.ok) throw new Error(`${url}: ${response.status}`);
    return await response.json();
  } finally {
    clearTimeout(timer);
  }
}

async function followPeers(status) {
  const urls = status.peer_dashboards || {};
  await Promise.all(
    Object.entries(urls).map(async ([peer, url]) => {
      try {
        const theirs = await fetchJson(`${url}/status`, PEER_TIMEOUT_MS);
        // Only a status that names the peer it was announced by.
        if (theirs && theirs.peer_id === peer) peerStatus.set(peer, theirs);
      } catch (_) {
        peerStatus.delete(peer);
      }
    }),
  );
  for (const peer of [...peerStatus.keys()]) if (!(peer in urls)) peerStatus.delete(peer);
}

const short = (peer) => (peer ? peer.slice(0, 8) + "…" + peer.slice(-6) : "–");
const el = (tag, attrs = {}, text) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
};

function drawStages(status) {
  const root = document.getElementById("stages");
  root.replaceChildren();
  const live = new Set(status.live_peers || []);
  (status.stage_map || []).forEach((miners, stage) => {
    const box = el("div", { class: "stage", "data-stage": String(stage) });
    box.append(el("h3", {}, `stage ${stage} · ${miners.length} replica(s)`));
    for (const peer of miners) {
      const state = live.has(peer) || peer === status.peer_id ? "live" : "gone";
      box.append(el("div", { class: `miner ${state}`, "data-peer": peer, title: peer }, short(peer)));
    }
    root.append(box);
  });
  if (!root.children.length) root.textContent = "no plan yet";
}

function drawLoss(epochs) {
  const svg = document.getElementById("loss");
  const ns = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  const series = [
    ["train", "#3c6fd8", epochs.map((e) => [e.epoch, e.train_loss])],
    ["val", "#e07b00", epochs.map((e) => [e.epoch, e.val_loss])],
  ].map(([name, color, pts]) => [name, color, pts.filter(([, y]) => typeof y === "number" && isFinite(y))]);
  const all = series.flatMap(([, , pts]) => pts);
  if (!all.length) return;
  const [w, h, pad] = [640, 260, 36];
  const xs = all.map(([x]) => x), ys = all.map(([, y]) => y);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs, Math.min(...xs) + 1)];
  const [y0, y1] = [Math.min(...ys) * 0.95, Math.max(...ys) * 1.02];
  const px = (x) => pad + ((x - x0) / (x1 - x0)) * (w - 2 * pad);
  const py = (y) => h - pad - ((y - y0) / (y1 - y0 || 1)) * (h - 2 * pad);
  const axis = document.createElementNS(ns, "path");
  axis.setAttribute("d", `M${pad},${pad} V${h - pad} H${w - pad}`);
  axis.setAttribute("stroke", "#999");
  axis.setAttribute("fill", "none");
  svg.append(axis);
  for (const [label, y] of [[y1.toFixed(2), y1], [y0.toFixed(2), y0]]) {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", 2);
    t.setAttribute("y", py(y) + 4);
    t.setAttribute("font-size", "11");
    t.textContent = label;
    svg.append(t);
  }
  for (const [name, color, pts] of series) {
    if (!pts.length) continue;
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", pts.map(([x, y]) => `${px(x)},${py(y)}`).join(" "));
    line.setAttribute("stroke", color);
    line.setAttribute("fill", "none");
    line.setAttribute("stroke-width", "2");
    line.setAttribute("class", `series-${name}`);
    svg.append(line);
    for (const [x, y] of pts) {
      const dot = document.createElementNS(ns, "circle");
      dot.setAttribute("cx", px(x));
      dot.setAttribute("cy", py(y));
      dot.setAttribute("r", 3);
      dot.setAttribute("fill", color);
      dot.setAttribute("class", `point-${name}`);
      dot.setAttribute("data-epoch", x);
      svg.append(dot);
    }
  }
}

// The latest held-out loss in nats per token and, once the node knows the dataset's bytes per
// token, in bits per byte of held-out text (what compares runs whose tokenizers differ).
function drawHeldOut(epochs) {
  const out = document.getElementById("val-latest");
  const finite = (v) => typeof v === "number" && isFinite(v);
  const latest = [...epochs].reverse().find((e) => finite(e.val_loss));
  if (!latest) {
    out.textContent = "";
    return;
  }
  const bits = finite(latest.val_bits_per_byte) ? ` · ${latest.val_bits_per_byte.toFixed(3)} bits/byte` : "";
  out.textContent = `held-out at the start of epoch ${latest.epoch}: ${latest.val_loss.toFixed(3)} nats/token${bits}`;
}

function drawMiners(status) {
  const body = document.querySelector("#miners tbody");
  body.replaceChildren();
  const epochs = status.epochs || [];
  const latest = epochs.length ? epochs[epochs.length - 1] : null;
  const stageOf = new Map();
  (status.stage_map || []).forEach((miners, s) => miners.forEach((m) => stageOf.set(m, s)));
  const weightOf = new Map(((status.weights && status.weights.miners) || []).map((m) => [m.peer_id, m.weight]));
  const samples = (latest && latest.samples_by_miner) || {};
  const wire = (latest && latest.wire_bytes) || {};
  const peers = new Set([...stageOf.keys(), ...Object.keys(samples)]);
  for (const peer of [...peers].sort()) {
    const row = el("tr", { "data-peer": peer });
    row.append(el("td", { class: "peer", title: peer }, short(peer)));
    row.append(el("td", {}, stageOf.has(peer) ? String(stageOf.get(peer)) : "–"));
    row.append(el("td", {}, String(samples[peer] || 0)));
    const own = peerStatus.get(peer);
    const served = own && typeof own.samples_processed === "number" ? String(own.samples_processed) : "–";
    row.append(el("td", { class: "served" }, served));
    row.append(el("td", {}, wire[peer] !== undefined ? String(wire[peer]) : "–"));
    row.append(el("td", {}, weightOf.has(peer) ? Number(weightOf.get(peer)).toFixed(3) : "–"));
    body.append(row);
  }
}

// Every live peer as the node knows it: a validator with a permit, a miner of the plan, or
// unverified (whatever it claims). Only the first two come with their server's address.
function drawPeers(status) {
  const body = document.querySelector("#peers tbody");
  body.replaceChildren();
  const urls = status.peer_dashboards || {};
  const paths = (status.nat && status.nat.peer_paths) || {};
  for (const p of status.peers || []) {
    const row = el("tr", { "data-peer": p.peer_id });
    row.append(el("td", { class: "peer", title: p.peer_id }, short(p.peer_id)));
    row.append(el("td", { class: "kind" }, String(p.kind)));
    // How this node reaches the peer: direct, relayed, or not connected now.
    row.append(el("td", { class: "path" }, String(paths[p.peer_id] || "–")));
    const cell = el("td", { class: "url" });
    const url = p.kind === "unverified" ? undefined : urls[p.peer_id];
    if (typeof url === "string" && /^http:\/\/[0-9a-fA-F.:\[\]]+$/.test(url)) {
      cell.append(el("a", { href: url, rel: "noreferrer" }, url));
    } else {
      cell.textContent = "–";
    }
    row.append(cell);
    body.append(row);
  }
}

function drawValidators(status) {
  const body = document.querySelector("#validators tbody");
  body.replaceChildren();
  for (const v of (status.weights && status.weights.validators) || []) {
    const row = el("tr");
    row.append(el("td", { class: "peer", title: v.peer_id || v.hotkey }, short(v.peer_id || v.hotkey)));
    row.append(el("td", {}, String(v.stake)));
    row.append(el("td", {}, v.trust !== undefined ? Number(v.trust).toFixed(3) : "–"));
    body.append(row);
  }
}

// The node's reachability as AutoNAT found it, the relays it listens through when private,
// and what its own relay server holds.
function reachText(nat) {
  if (!nat) return "";
  const parts = [`reachability ${nat.reachability}`];
  if ((nat.relays || []).length) parts.push(`relays ${nat.relays.map(short).join(", ")}`);
  parts.push(`hole punches ${nat.hole_punches_succeeded} ok, ${nat.hole_punches_failed} failed`);
  if (nat.relay_server) {
    parts.push(`relay server ${nat.relay_reservations} reservations, ${nat.relay_circuits} circuits`);
  }
  return parts.join(" · ");
}

function draw(status) {
  document.getElementById("role").textContent = status.role;
  document.getElementById("node").textContent = status.peer_id;
  document.getElementById("reach").textContent = reachText(status.nat);
  document.getElementById("epoch").textContent = status.epoch ?? "–";
  document.getElementById("orchestrator").textContent =
    "orchestrator " + (status.is_orchestrator ? "this node" : short(status.orchestrator));
  const epochs = status.epochs || [];
  const current = epochs.find((e) => e.epoch === status.epoch);
  const heads = (status.stage_map && status.stage_map[0] && status.stage_map[0].length) || 0;
  const total = (status.epoch_samples || 0) * heads;
  const done = current ? current.samples : 0;
  document.getElementById("progress").style.width = total ? `${Math.min(100, (100 * done) / total)}%` : "0";
  document.getElementById("progress-text").textContent = total ? `${done} of ${total} samples` : "";
  drawStages(status);
  drawLoss(epochs);
  drawHeldOut(epochs);
  drawMiners(status);
  drawValidators(status);
  drawPeers(status);
}

async function follow() {
  const error = document.getElementById("error");
  try {
    const status = await fetchJson("/status", OWN_TIMEOUT_MS);
    await followPeers(status);
    draw(status);
    error.hidden = true;
  } catch (e) {
    error.hidden = false;
    error.textContent = String(e);
  }
  setTimeout(follow, 1000);
}

follow();
