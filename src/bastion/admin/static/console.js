// bastion admin console: the little JavaScript it has. Loaded from bastion itself (CSP: script-src 'self').
"use strict";

// Sections with data-refresh re-fetch their HTML (same-origin, cookie-authenticated GET) every data-interval ms.
function refreshing(el) {
  const url = el.dataset.refresh;
  const every = parseInt(el.dataset.interval || "2000", 10);
  async function tick() {
    try {
      const r = await fetch(url, {credentials: "same-origin", headers: {"accept": "text/html"}});
      if (r.status === 401) { window.location = "/login"; return; }
      if (r.ok) { el.innerHTML = await r.text(); }
    } catch (e) { /* the gateway may be restarting: try again next tick */ }
    setTimeout(tick, every);
  }
  setTimeout(tick, every);
}

function cell(row, text) {
  const td = document.createElement("td");
  td.textContent = text == null ? "" : String(text);
  row.appendChild(td);
}

// The live table: one EventSource on the stream, filtered by the form's query string.
function live(table) {
  const body = table.querySelector("tbody");
  const detail = document.getElementById("record");
  const source = new EventSource(table.dataset.stream + window.location.search);
  source.onmessage = (ev) => {
    const rec = JSON.parse(ev.data);
    const row = document.createElement("tr");
    const tool = rec.tool && typeof rec.tool === "object" ? rec.tool.name : rec.tool;
    cell(row, rec.time);
    cell(row, rec.event);
    cell(row, rec.principal ? rec.principal.id : "");
    cell(row, tool);
    cell(row, rec.decision);
    cell(row, rec.rule_id);
    row.className = "decision-" + (rec.decision || "none");
    row.dataset.event = rec.event;
    row.addEventListener("click", () => { detail.textContent = JSON.stringify(rec, null, 2); });
    body.insertBefore(row, body.firstChild);
    while (body.rows.length > 500) { body.deleteRow(body.rows.length - 1); }
  };
}

// The approvals table: the stream says that something was opened or decided (kind and id, never arguments);
// the table is then re-fetched as the server renders it, forms and CSRF tokens included. Reloads never overlap:
// events that arrive during one cause exactly one more.
function approvals(section) {
  let running = false;
  let again = false;
  async function reload() {
    if (running) { again = true; return; }
    running = true;
    try {
      do {
        again = false;
        const r = await fetch(section.dataset.partial, {credentials: "same-origin", headers: {"accept": "text/html"}});
        if (r.status === 401) { window.location = "/login"; return; }
        if (r.ok) { section.innerHTML = await r.text(); }
      } while (again);
    } catch (e) { /* the gateway may be restarting: the stream reconnects and syncs again */ }
    finally { running = false; }
  }
  const source = new EventSource(section.dataset.stream);
  source.onmessage = reload;
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-refresh]").forEach(refreshing);
  document.querySelectorAll("select[data-autosubmit]").forEach((el) => {
    el.addEventListener("change", () => el.form.submit());
  });
  const pending = document.getElementById("approvals");
  if (pending && pending.dataset.stream) { approvals(pending); }
  const table = document.getElementById("live");
  if (table) { live(table); }
});
