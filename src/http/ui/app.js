// The conversation page: reads /compactor/v1/conversations… with the key typed into the form
// (kept in sessionStorage, sent as `Authorization: Bearer`) and draws what they answer. Every
// text from the proxy is set as text, never parsed as markup.
"use strict";

const KEY_SLOT = "compactor.key";
const SVG = "http://www.w3.org/2000/svg";

function $(selector) {
  return document.querySelector(selector);
}

function element(tag, attributes, text) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    node.setAttribute(name, value);
  }
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function svgElement(tag, attributes) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    node.setAttribute(name, String(value));
  }
  return node;
}

function say(text) {
  $("#message").textContent = text || "";
}

function number(n) {
  return Number(n).toLocaleString("en-US");
}

function when(ms) {
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

function short(id) {
  return id ? id.slice(0, 16) : "";
}

async function read(path) {
  const key = sessionStorage.getItem(KEY_SLOT) || "";
  const response = await fetch(path, {
    headers: key ? { Authorization: "Bearer " + key } : {},
    cache: "no-store",
  });
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const message = body && body.error && body.error.message;
    throw new Error(message || response.status + " " + response.statusText);
  }
  return body;
}

// ---- the list ----

async function showList() {
  const answer = await read("/compactor/v1/conversations");
  const limits = answer.limits;
  $("#limits").textContent = answer.enabled
    ? "Kept: the newest " + limits.requests_per_conversation + " requests of each of the " +
      limits.conversations + " most recently active conversations."
    : "Timelines are turned off ([timeline] enabled = false).";
  const body = $("#conversations tbody");
  body.replaceChildren();
  for (const c of answer.conversations) {
    const row = element("tr", { "data-conversation": c.id });
    row.append(
      element("td", {}, short(c.id)),
      element("td", {}, c.tenant_name || short(c.tenant)),
      element("td", {}, c.last.model),
      element("td", { class: "number" }, number(c.requests)),
      element("td", { class: "number" }, number(c.compactions)),
      element("td", { class: "number" }, number(c.last.tokens_sent) + " / " + number(c.last.tokens_forwarded)),
      element("td", {}, when(c.last_ms)),
    );
    row.addEventListener("click", () => {
      location.hash = c.id;
    });
    body.append(row);
  }
  if (answer.conversations.length === 0) {
    const row = element("tr");
    row.append(element("td", { colspan: "7" }, "No conversation of this key yet."));
    body.append(row);
  }
}

// ---- one conversation ----

async function showConversation(id) {
  const [timeline, stored] = await Promise.all([
    read("/compactor/v1/conversations/" + encodeURIComponent(id)),
    read("/compactor/v1/conversations/" + encodeURIComponent(id) + "/checkpoints"),
  ]);
  for (const row of document.querySelectorAll("#conversations tbody tr")) {
    row.classList.toggle("selected", row.dataset.conversation === id);
  }
  const c = timeline.conversation;
  $("#conversation-id").textContent = short(c.id);
  $("#conversation-facts").textContent =
    number(c.requests) + " requests from " + when(c.first_ms) + " to " + when(c.last_ms) +
    ", " + number(c.compactions) + " compactions" +
    (timeline.dropped_requests > 0 ? "; the oldest " + number(timeline.dropped_requests) + " rows are no longer kept" : "") +
    (c.tenant_name ? "; tenant " + c.tenant_name : "");
  drawChart(timeline.requests);
  fillRequests(timeline.requests);
  fillCheckpoints(stored.checkpoints);
  $("#conversation").hidden = false;
}

function drawChart(rows) {
  const width = 960, height = 340;
  const left = 70, right = 20, top = 24, bottom = 40;
  const plotWidth = width - left - right, plotHeight = height - top - bottom;
  const most = Math.max(1, ...rows.map((r) => Math.max(r.tokens_sent, r.tokens_forwarded, r.window)));
  const x = (i) => left + (rows.length <= 1 ? plotWidth / 2 : (i * plotWidth) / (rows.length - 1));
  const y = (tokens) => top + plotHeight - (tokens / (most * 1.08)) * plotHeight;
  const svg = svgElement("svg", {
    viewBox: "0 0 " + width + " " + height,
    role: "img",
    "aria-label": "tokens as sent and forwarded per request, with the window and each compaction",
    "data-testid": "chart",
  });
  for (let step = 0; step <= 4; step++) {
    const tokens = (most * 1.08 * step) / 4;
    svg.append(svgElement("line", { class: "grid", x1: left, x2: width - right, y1: y(tokens), y2: y(tokens) }));
    const label = svgElement("text", { x: left - 6, y: y(tokens) + 4, "text-anchor": "end" });
    label.textContent = number(Math.round(tokens));
    svg.append(label);
  }
  svg.append(svgElement("line", { class: "axis", x1: left, x2: left, y1: top, y2: top + plotHeight }));
  svg.append(svgElement("line", { class: "axis", x1: left, x2: width - right, y1: top + plotHeight, y2: top + plotHeight }));
  const axisLabel = svgElement("text", { x: left + plotWidth / 2, y: height - 8, "text-anchor": "middle" });
  axisLabel.textContent = "request (" + rows.length + " kept)";
  svg.append(axisLabel);

  rows.forEach((row, i) => {
    if (!row.new_checkpoint) return;
    const mark = svgElement("g", { "data-testid": "compaction-mark", "data-checkpoint": row.checkpoint || "", "data-request": i + 1 });
    mark.append(svgElement("line", { class: "compaction-mark", x1: x(i), x2: x(i), y1: top, y2: top + plotHeight }));
    mark.append(svgElement("rect", { class: "compaction-flag", x: x(i) - 5, y: top - 12, width: 10, height: 10 }));
    const title = svgElement("title");
    title.textContent = "request " + (i + 1) + ": checkpoint " + short(row.checkpoint) + (row.summarized ? " (summarized here)" : "");
    mark.append(title);
    mark.addEventListener("click", () => openCheckpoint(row.checkpoint));
    svg.append(mark);
  });
  const path = (field) => rows.map((r, i) => x(i).toFixed(1) + "," + y(r[field]).toFixed(1)).join(" ");
  if (rows.length > 0) {
    svg.append(svgElement("polyline", { class: "window", points: path("window"), "data-testid": "window-line" }));
    svg.append(svgElement("polyline", { class: "sent", points: path("tokens_sent") }));
    svg.append(svgElement("polyline", { class: "forwarded", points: path("tokens_forwarded") }));
  }
  for (const series of [["sent", "tokens_sent"], ["forwarded", "tokens_forwarded"]]) {
    rows.forEach((row, i) => {
      const point = svgElement("circle", { class: "point " + series[0], "data-series": series[0], cx: x(i), cy: y(row[series[1]]), r: 2.5 });
      const title = svgElement("title");
      title.textContent = "request " + (i + 1) + ": " + number(row[series[1]]) + " tokens " + (series[0] === "sent" ? "as sent" : "forwarded");
      point.append(title);
      svg.append(point);
    });
  }
  $("#chart-box").replaceChildren(svg);
}

function fillRequests(rows) {
  const body = $("#requests tbody");
  body.replaceChildren();
  rows.forEach((r, i) => {
    const classes = [r.new_checkpoint ? "compaction" : "", r.status >= 400 || r.compaction_status ? "failed" : ""].join(" ").trim();
    const row = element("tr", classes ? { class: classes } : {});
    const checkpoint = element("td");
    if (r.checkpoint) {
      const link = element("a", { href: "#" }, short(r.checkpoint) + (r.new_checkpoint ? " (new)" : ""));
      link.addEventListener("click", (event) => {
        event.preventDefault();
        openCheckpoint(r.checkpoint);
      });
      checkpoint.append(link);
    }
    row.append(
      element("td", { class: "number" }, i + 1),
      element("td", {}, when(r.at_ms)),
      element("td", {}, r.path),
      element("td", {}, r.model),
      element("td", { class: "number" }, r.status),
      element("td", { class: "number" }, number(r.tokens_sent)),
      element("td", { class: "number" }, number(r.tokens_forwarded)),
      element("td", { class: "number" }, number(r.window)),
      checkpoint,
      element("td", { class: "number" }, r.summary_ms ? number(r.summary_ms) + " ms" + (r.summarized ? " (summarized)" : "") : ""),
      element("td", { class: "number" }, number(r.upstream_ms) + " ms"),
      element("td", {}, r.compaction_status || (r.ahead_of_time ? "prepared ahead of time" : "")),
    );
    body.append(row);
  });
}

function fillCheckpoints(checkpoints) {
  const box = $("#checkpoints");
  box.replaceChildren();
  if (checkpoints.length === 0) {
    box.append(element("p", { class: "hint" }, "No checkpoint stored for this conversation."));
  }
  for (const cp of checkpoints) {
    const details = element("details", { class: "checkpoint", "data-checkpoint": cp.id });
    details.append(element("summary", {}, "Checkpoint " + short(cp.id) + ", " + when(cp.created_ms) + (cp.ahead_of_time ? ", prepared ahead of time" : "")));
    details.append(element("p", { class: "facts" },
      "Covers the first " + cp.covered + " messages (" + number(cp.tokens_before) + " tokens before, " +
      number(cp.tokens_after) + " after), summarized by " + cp.model +
      (cp.pinned_user !== null && cp.pinned_user !== undefined ? "; message " + cp.pinned_user + " kept verbatim" : "") +
      (cp.truncations.length ? "; " + cp.truncations.length + " kept messages shortened" : "") + "."));
    details.append(element("h4", {}, "Summary (written by the summarizer)"));
    details.append(element("pre", { class: "model-text" }, cp.model_text));
    for (const section of cp.code_sections) {
      details.append(element("h4", {}, section.title + " (written by code)"));
      details.append(element("pre", { class: "code-section" }, section.text));
    }
    const files = element("div", { class: "files" });
    for (const [title, list] of [["Files read", cp.files_read], ["Files modified", cp.files_modified]]) {
      const column = element("div");
      column.append(element("h4", {}, title + " (" + list.length + ")"));
      const items = element("ul");
      for (const file of list) items.append(element("li", {}, file));
      column.append(items);
      files.append(column);
    }
    details.append(files);
    box.append(details);
  }
}

function openCheckpoint(id) {
  const details = [...document.querySelectorAll("details.checkpoint")].find((d) => d.dataset.checkpoint === id);
  if (!details) {
    say("Checkpoint " + short(id) + " is no longer stored (a newer one replaced it).");
    return;
  }
  details.open = true;
  details.scrollIntoView({ block: "start" });
}

// ---- wiring ----

async function refresh() {
  say("");
  if (!sessionStorage.getItem(KEY_SLOT)) {
    say("Enter a key to see its conversations.");
    return;
  }
  try {
    await showList();
    const id = location.hash.slice(1);
    if (id) {
      await showConversation(id);
    } else {
      $("#conversation").hidden = true;
    }
  } catch (error) {
    say(error.message);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("#key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY_SLOT, $("#key").value.trim());
    $("#key").value = "";
    refresh();
  });
  $("#forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_SLOT);
    $("#conversations tbody").replaceChildren();
    $("#conversation").hidden = true;
    say("Key forgotten.");
  });
  window.addEventListener("hashchange", refresh);
  refresh();
});
