// zerohub console: draws /api/status, again every data-refresh-ms milliseconds.
// Every value goes into the page as a text node: names chosen by clients stay text.
"use strict";

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
  fill("queues", b.queue_list || [], [
    ["channel", false], ["queue", false], ["status", false], ["messages", true],
    ["unacked", true], ["consumers", true],
  ]);
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
refresh();
setInterval(refresh, every);
