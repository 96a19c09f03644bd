// zerohub console: draws /api/status, again every data-refresh-ms milliseconds, and
// sends the actions (POST /api/action with the token in X-Zerohub-Token).
// Every value goes into the page as a text node: names chosen by clients stay text.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const STATUSES = ["Broadcast", "Push", "RoundRobin", "Pull", "Cache", "Paused", "Stopped"];
const TOKEN_KEY = "zerohub-console-token";

function cell(row, value, numeric) {
  const td = document.createElement("td");
  td.textContent = value === undefined || value === null ? "" : String(value);
  if (numeric) td.className = "n";
  row.appendChild(td);
}

function fill(tableId, rows, columns) {
  const body = document.querySelector("#" + tableId + " tbody");
  const fresh = document.createElement("tbody");
  for (const item of rows) {
    const tr = document.createElement("tr");
    for (const [key, numeric] of columns) {
      const value = typeof key === "function" ? key(item) : item[key];
      cell(tr, value, numeric);
    }
    fresh.appendChild(tr);
  }
  body.replaceWith(fresh);
}

// A small line chart of a queue's rates (in: green, out: blue), drawn as inline SVG.
function chart(history) {
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "chart");
  svg.setAttribute("viewBox", "0 0 120 28");
  const points = history || [];
  let top = 1;
  for (const [i, o] of points) top = Math.max(top, i, o);
  for (const [index, name] of [[0, "in"], [1, "out"]]) {
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("class", name);
    const step = points.length > 1 ? 120 / (points.length - 1) : 0;
    line.setAttribute("points", points.map((p, k) =>
      (k * step).toFixed(1) + "," + (27 - (p[index] / top) * 26).toFixed(1)).join(" "));
    svg.appendChild(line);
  }
  const title = document.createElementNS(SVG, "title");
  title.textContent = "peak " + top + "/s (in: green, out: blue)";
  svg.appendChild(title);
  return svg;
}

function button(label, action, q) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.dataset.action = action;
  b.dataset.channel = q.channel;
  b.dataset.queue = String(q.queue);
  return b;
}

function statusPicker(q) {
  const select = document.createElement("select");
  select.dataset.action = "set-status";
  select.dataset.channel = q.channel;
  select.dataset.queue = String(q.queue);
  for (const name of STATUSES) {
    const option = document.createElement("option");
    option.value = name;
    option.textContent = name;
    option.selected = name === q.status;
    select.appendChild(option);
  }
  return select;
}

function queueRows(queues) {
  const body = document.querySelector("#queues tbody");
  const fresh = document.createElement("tbody");
  for (const q of queues) {
    const tr = document.createElement("tr");
    for (const [key, numeric] of [["channel", false], ["queue", false], ["status", false],
      ["messages", true], ["unacked", true], ["consumers", true], ["in_rate", true],
      ["out_rate", true]]) cell(tr, q[key], numeric);
    const graph = document.createElement("td");
    graph.appendChild(chart(q.history));
    tr.appendChild(graph);
    const acts = document.createElement("td");
    acts.className = "act";
    acts.appendChild(statusPicker(q));
    for (const [label, action] of [["browse", "browse"], ["trash", "trash"], ["purge", "purge"],
      ["delete", "delete-queue"]]) acts.appendChild(button(label, action, q));
    tr.appendChild(acts);
    fresh.appendChild(tr);
  }
  body.replaceWith(fresh);
}

function cards(id, figures) {
  const box = document.getElementById(id);
  box.replaceChildren();
  for (const [label, value] of figures) {
    const div = document.createElement("div");
    div.className = "card";
    const b = document.createElement("b");
    b.textContent = String(value);
    div.appendChild(b);
    div.appendChild(document.createTextNode(label));
    box.appendChild(div);
  }
}

function draw(status) {
  const f = status.files || {};
  cards("files-cards", [
    ["files published", f.files], ["subscribers", f.clients], ["files sent", f.sent_files],
    ["bytes sent", f.sent_bytes], ["resyncs", f.resyncs], ["watcher overflows", f.watcher_overflows],
  ]);
  fill("mounts", f.mounts || [], [["at", false], ["dir", false], ["files", true]]);
  fill("subscribers", f.subscribers || [], [
    ["client", false], [(s) => (s.paths || []).join(" "), false], ["queued", true],
    ["sent_files", true], ["sent_bytes", true],
  ]);
  const b = status.broker || {};
  cards("broker-cards", b.error ? [["error: " + b.error, "!"]] : [
    ["clients", b.clients], ["channels", b.channels], ["queues", b.queues],
    ["messages", b.messages], ["unacked", b.pending_acks], ["received", b.received],
    ["deliveries", b.deliveries], ["acks", b.acks], ["nacks", b.nacks],
    ["dropped", b.dropped_deliveries],
  ]);
  fill("channels", b.channel_list || [], [["name", false], ["consumers", true]]);
  fill("clients", b.client_list || [], [
    ["id", false], ["name", false], ["type", false], ["address", false],
    ["connected_s", true], [(c) => (c.channels || []).join(" "), false], ["unacked", true],
    ["unsent", true],
  ]);
  document.getElementById("clients-more").textContent =
    b.clients_more > 0 ? b.clients_more + " more clients connected (not listed)" : "";
  if (!document.querySelector("#queues select:focus")) queueRows(b.queue_list || []);
}

function say(text, ok) {
  const outcome = document.getElementById("outcome");
  outcome.textContent = text;
  outcome.className = ok ? "ok" : "error";
}

async function act(request) {
  const token = sessionStorage.getItem(TOKEN_KEY) || "";
  let result;
  try {
    const answer = await fetch("/api/action", {
      method: "POST",
      cache: "no-store",
      headers: { "Content-Type": "application/json", "X-Zerohub-Token": token },
      body: JSON.stringify(request),
    });
    result = await answer.json().catch(() => ({ error: "HTTP " + answer.status }));
    if (!answer.ok && !result.error) result.error = "HTTP " + answer.status;
  } catch (err) {
    result = { error: err.message };
  }
  say(result.error ? "refused: " + result.error : result.done || "done", !result.error);
  if (!result.error && request.action !== "browse" && request.action !== "trash") refresh();
  return result;
}

function showBrowsed(result) {
  const box = document.getElementById("browse");
  document.getElementById("browse-title").textContent =
    result.channel + "/" + result.queue + " (" + result.messages.length + " shown)";
  fill("browsed", result.messages, [
    [(m) => result.messages.indexOf(m) + 1, true], ["sequence", true], ["id", false],
    ["producer", false], ["size", true],
    [(m) => (m.text !== undefined ? m.text : "base64: " + m.base64), false],
  ]);
  box.hidden = false;
}

// A queue's trash: what left it unconsumed, with why; each message (or all of them)
// can be pushed back into the queue or removed for good.
function showTrash(result) {
  const box = document.getElementById("trash");
  box.dataset.channel = result.channel;
  box.dataset.queue = String(result.queue);
  document.getElementById("trash-title").textContent =
    result.channel + "/" + result.queue + " (" + result.messages.length + " shown)";
  const body = document.querySelector("#trashed tbody");
  const fresh = document.createElement("tbody");
  for (const m of result.messages) {
    const tr = document.createElement("tr");
    cell(tr, m.sequence, true);
    cell(tr, m.id, false);
    cell(tr, m.reason, false);
    cell(tr, m.size, true);
    cell(tr, m.text !== undefined ? m.text : "base64: " + m.base64, false);
    const acts = document.createElement("td");
    acts.className = "act";
    for (const [label, action] of [["resubmit", "trash-resubmit"], ["purge", "trash-purge"]]) {
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = label;
      b.dataset.action = action;
      b.dataset.sequence = String(m.sequence);
      acts.appendChild(b);
    }
    tr.appendChild(acts);
    fresh.appendChild(tr);
  }
  body.replaceWith(fresh);
  box.hidden = false;
}

async function listTrash(channel, queue) {
  const result = await act({ action: "trash", channel, queue, limit: 100 });
  if (!result.error) showTrash(result);
  return result;
}

async function onTrashAction(target) {
  const box = document.getElementById("trash");
  const channel = box.dataset.channel;
  const queue = Number(box.dataset.queue);
  const request = { action: target.dataset.action, channel, queue };
  if (target.dataset.sequence) request.sequences = [Number(target.dataset.sequence)];
  const what = target.dataset.sequence ? "message " + target.dataset.sequence : "everything";
  if (request.action === "trash-purge" &&
      !confirm("remove " + what + " from the trash of " + channel + "/" + queue + "?")) return;
  const result = await act(request);
  if (!result.error) {
    const shown = await listTrash(channel, queue);
    if (!shown.error) say(result.done, true);
  }
}

async function onQueueAction(target) {
  const request = { action: target.dataset.action, channel: target.dataset.channel,
    queue: Number(target.dataset.queue) };
  const where = request.channel + "/" + request.queue;
  if (request.action === "set-status") request.status = target.value;
  if (request.action === "browse") request.limit = 20;
  if (request.action === "trash") { listTrash(request.channel, request.queue); return; }
  if ((request.action === "purge" || request.action === "delete-queue") &&
      !confirm(request.action + " " + where + "?")) return;
  const result = await act(request);
  if (request.action === "browse" && !result.error) showBrowsed(result);
}

// The link zerohub serve prints carries the token after '#' (never sent to a server):
// kept for this tab's life, then taken out of the address bar and the history.
function tokenFromLink(known) {
  const fromLink = new URLSearchParams(location.hash.slice(1)).get("token");
  if (fromLink) {
    sessionStorage.setItem(TOKEN_KEY, fromLink);
    history.replaceState(null, "", location.pathname);
  }
  known();
}

function setUp() {
  const tokenState = document.getElementById("token-state");
  const known = () => { tokenState.textContent = sessionStorage.getItem(TOKEN_KEY) ?
    "token set" : "no token: actions are refused"; };
  tokenFromLink(known);
  window.addEventListener("hashchange", () => tokenFromLink(known));
  document.getElementById("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
    document.getElementById("token").value = "";
    known();
  });
  const picker = document.getElementById("new-status");
  for (const name of STATUSES) {
    const option = document.createElement("option");
    option.value = name;
    option.textContent = name;
    picker.appendChild(option);
  }
  document.getElementById("create-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const channel = document.getElementById("new-channel").value;
    const queue = document.getElementById("new-queue").value;
    const status = picker.value;
    if (queue === "") act({ action: "create-channel", channel });
    else act({ action: "create-queue", channel, queue: Number(queue),
      ...(status ? { status } : {}) });
  });
  document.getElementById("delete-channel").addEventListener("click", () => {
    const channel = document.getElementById("new-channel").value;
    if (channel && confirm("delete channel " + channel + "?")) {
      act({ action: "delete-channel", channel });
    }
  });
  const queues = document.getElementById("queues");
  queues.addEventListener("click", (event) => {
    const target = event.target.closest("button[data-action]");
    if (target) onQueueAction(target);
  });
  document.getElementById("trash").addEventListener("click", (event) => {
    const target = event.target.closest("button[data-action]");
    if (target) onTrashAction(target);
  });
  queues.addEventListener("change", (event) => {
    const target = event.target.closest("select[data-action]");
    if (target) onQueueAction(target);
  });
}


async function refresh() {
  const state = document.getElementById("state");
  try {
    const answer = await fetch("/api/status", { cache: "no-store" });
    if (!answer.ok) throw new Error("HTTP " + answer.status);
    draw(await answer.json());
    state.textContent = "up · " + new Date().toLocaleTimeString();
    state.className = "ok";
  } catch (err) {
    state.textContent = "unreachable (" + err.message + ")";
    state.className = "error";
  }
}

const every = Number(document.body.dataset.refreshMs) || 2000;
setUp();
refresh();
setInterval(refresh, every);
