// The watch page: a run's rounds as they are logged (live) or as they were (replay).
// Every text from the run goes into the page as text (textContent), never as HTML.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const state = { rounds: [], shown: null, delta: null, controller: "", token: "", follow: true, ended: false,
                  series: null, picked: null, loading: false, other: null };
  const SVG = "http://www.w3.org/2000/svg";
  const COLOURS = ["#1b6ca8", "#d1495b", "#2e933c", "#edae49", "#7d4e9e", "#00798c", "#8d6a48", "#e07a5f"];
  const DOTS_UP_TO = 300; // rounds with a point each (a hover shows its value); past it, lines only
  window.renderTimes = [];
  window.watchState = state;

  const token = new URLSearchParams(location.hash.slice(1)).get("token") || "";
  state.token = token;

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }

  async function api(path, options) {
    const response = await fetch(path, options);
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    return body;
  }

  function setStatus(text, paused) {
    $("status").textContent = text;
    $("status").className = paused ? "paused" : "";
  }

  function roleLink(name) {
    const span = el("span", name, "role");
    span.addEventListener("click", () => openRole(name));
    return span;
  }

  function bars(target, counts) {
    const box = $(target);
    box.replaceChildren();
    const entries = Object.entries(counts);
    const most = Math.max(1, ...entries.map(([, n]) => n));
    for (const [label, n] of entries.slice(0, 30)) {
      const row = el("div");
      const bar = el("span", undefined, "bar");
      bar.style.width = `${Math.round((160 * n) / most)}px`;
      row.append(bar, el("span", `${label}: ${n}`));
      box.append(row);
    }
  }

  function render(delta) {
    const started = performance.now();
    state.delta = delta;
    state.shown = delta.round;
    $("round-label").textContent = String(delta.round);
    $("scrub").value = String(state.rounds.indexOf(delta.round));
    $("totals").textContent =
      `round ${delta.round}: ${delta.messages} messages from ${delta.senders} roles, ` +
      `${delta.calls} model calls, ${delta.tokens} tokens, cost ${delta.cost}`;
    bars("actions", delta.actions);
    const perSender = {};
    for (const [sent, roles] of Object.entries(delta.per_sender)) perSender[`${sent} sent`] = roles;
    bars("per-sender", perSender);
    const metrics = $("metrics");
    metrics.replaceChildren();
    for (const [key, value] of Object.entries(delta.metrics)) {
      const row = el("tr");
      row.append(el("td", key), el("td", typeof value === "object" ? JSON.stringify(value) : value));
      metrics.append(row);
    }
    const events = $("events");
    events.replaceChildren();
    for (const event of delta.events) {
      events.append(el("li", `${event.kind}: ${event.detail || ""} ${event.role || ""} ${event.message_id || ""}`, event.kind));
    }
    const select = $("filter-action");
    const chosen = select.value;
    select.replaceChildren(el("option", "every action"));
    select.firstChild.value = "";
    for (const action of Object.keys(delta.actions)) {
      const option = el("option", action);
      option.value = action;
      select.append(option);
    }
    select.value = chosen in delta.actions ? chosen : "";
    drawFlow();
    drawChart();
    drawNetwork().catch(() => {});
    drawDistribution();
    document.body.dataset.round = String(delta.round);
    window.renderTimes.push(performance.now() - started);
  }

  function drawFlow() {
    const delta = state.delta;
    if (!delta) return;
    const role = $("filter-role").value.trim();
    const action = $("filter-action").value;
    const text = $("filter-text").value.trim().toLowerCase();
    const body = $("flow").tBodies[0];
    const rows = [];
    for (const [sender, to, act, id, said] of delta.flow) {
      if (role && sender !== role && !to.includes(role)) continue;
      if (action && act !== action) continue;
      if (text && !(said || "").toLowerCase().includes(text)) continue;
      const row = el("tr");
      const from = el("td");
      from.append(roleLink(sender));
      const recipients = el("td");
      to.slice(0, 8).forEach((name, i) => {
        if (i) recipients.append(", ");
        recipients.append(roleLink(name));
      });
      if (to.length > 8) recipients.append(` and ${to.length - 8} more`);
      const cell = el("td", said === null ? "…" : said, "said-cell");
      cell.title = said === null ? "the text is recorded with the run's next checkpoint" : "the conversation it starts";
      cell.addEventListener("click", () => openThread(id).catch((error) => setStatus(error.message, true)));
      row.append(from, recipients, el("td", act), cell);
      rows.push(row);
    }
    body.replaceChildren(...rows);
    const more = delta.messages - delta.flow.length;
    $("shown").textContent = `${rows.length} shown` + (more > 0 ? ` (the first ${delta.flow.length} of ${delta.messages})` : "");
  }

  function svg(tag, attributes, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, String(value));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  async function loadSeries() {
    if (state.loading) return;
    state.loading = true;
    try {
      state.series = await api("/api/series");
    } finally {
      state.loading = false;
    }
    const names = Object.keys(state.series.series);
    if (state.picked === null) state.picked = new Set(names.slice(0, 3));
    const box = $("chart-pick");
    if (box.childElementCount !== names.length) {
      box.replaceChildren(...names.map((name) => {
        const label = el("label");
        const tick = el("input");
        tick.type = "checkbox";
        tick.value = name;
        tick.checked = state.picked.has(name);
        tick.addEventListener("change", () => {
          if (tick.checked) state.picked.add(name);
          else state.picked.delete(name);
          drawChart();
        });
        label.append(tick, ` ${name}`);
        return label;
      }));
    }
    drawChart();
  }

  function drawChart() {
    const chart = $("chart");
    chart.replaceChildren();
    const { rounds, series } = state.series || { rounds: [], series: {} };
    if (!rounds.length) return;
    const first = rounds[0], span = Math.max(1, rounds[rounds.length - 1] - first);
    const x = (round) => (40 + (560 * (round - first)) / span).toFixed(1);
    chart.append(svg("text", { x: 40, y: 178, "font-size": 10 }, `round ${first}`));
    chart.append(svg("text", { x: 600, y: 178, "font-size": 10, "text-anchor": "end" }, `round ${rounds[rounds.length - 1]}`));
    [...state.picked].filter((name) => name in series).forEach((name, i) => {
      const values = series[name], colour = COLOURS[i % COLOURS.length];
      const theirs = (state.other && state.other.series.series[name]) || []; // one scale for both runs
      const present = [...values, ...theirs].filter((v) => v !== null);
      const low = Math.min(...present), high = Math.max(...present);
      const y = (v) => (high > low ? 150 - (130 * (v - low)) / (high - low) : 85).toFixed(1);
      const points = rounds.map((r, k) => (values[k] === null ? null : `${x(r)},${y(values[k])}`)).filter(Boolean);
      chart.append(svg("polyline", { points: points.join(" "), fill: "none", stroke: colour, "stroke-width": 1.5, "data-series": name }));
      chart.append(svg("text", { x: 606, y: 20 + 12 * i, "font-size": 10, fill: colour }, `${name} ${low}–${high}`));
      if (rounds.length > DOTS_UP_TO) return;
      rounds.forEach((round, k) => {
        if (values[k] === null) return;
        const dot = svg("circle", { cx: x(round), cy: y(values[k]), r: 3, fill: colour, class: "point",
                                    "data-series": name, "data-round": round, "data-value": values[k] });
        dot.append(svg("title", {}, `${name}, round ${round}: ${values[k]}`));
        chart.append(dot);
      });
    });
    drawOther(x, first);
    if (state.shown !== null && state.shown >= first) {
      chart.append(svg("line", { id: "now-line", x1: x(state.shown), x2: x(state.shown), y1: 8, y2: 165,
                                 stroke: "#888", "stroke-dasharray": "3 3", "data-round": state.shown }));
    }
  }

  async function drawNetwork() {
    if (!$("network-box").open) return;
    const net = await api(`/api/network?round=${state.shown ?? 0}`);
    const box = $("network");
    box.replaceChildren();
    const at = {};
    net.nodes.forEach((name, i) => {
      const angle = (2 * Math.PI * i) / Math.max(1, net.nodes.length);
      at[name] = [240 + 200 * Math.cos(angle), 240 + 200 * Math.sin(angle)];
    });
    const most = Math.max(1, ...net.edges.map(([, , n]) => n));
    for (const [from, to, count] of net.edges) {
      const [x1, y1] = at[from], [x2, y2] = at[to];
      const line = svg("line", { x1, y1, x2, y2, stroke: "#1b6ca8", "stroke-opacity": 0.35,
                                 "stroke-width": (0.5 + (3 * count) / most).toFixed(2),
                                 "data-from": from, "data-to": to, "data-count": count });
      line.append(svg("title", {}, `${from} → ${to}: ${count}`));
      box.append(line);
    }
    for (const name of net.nodes) {
      const [cx, cy] = at[name];
      const node = svg("circle", { cx, cy, r: 5, fill: "#d1495b", class: "node", "data-role": name });
      node.append(svg("title", {}, name));
      node.addEventListener("click", () => openRole(name));
      box.append(node);
    }
    $("network-note").textContent = `${net.nodes.length} of ${net.roles} roles` +
      (net.nodes.length < net.roles ? " (the busiest)" : "") + `, through round ${net.round}; click a role`;
    document.body.dataset.network = String(net.round);
  }

  function drawOther(x, first) {
    const other = state.other;
    if (!other) return;
    const { rounds, series } = other.series;
    [...state.picked].filter((name) => name in series).forEach((name, i) => {
      const values = series[name], mine = state.series.series[name] || [];
      const present = [...values, ...mine].filter((v) => v !== null);
      const low = Math.min(...present), high = Math.max(...present);
      const y = (v) => (high > low ? 150 - (130 * (v - low)) / (high - low) : 85).toFixed(1);
      const points = rounds.map((r, k) => (values[k] === null || r < first ? null : `${x(r)},${y(values[k])}`));
      $("chart").append(svg("polyline", { points: points.filter(Boolean).join(" "), fill: "none", "stroke-dasharray": "5 3",
                                     stroke: COLOURS[i % COLOURS.length], "stroke-width": 1.5, "data-series": name,
                                     "data-run": "other", "data-values": JSON.stringify(values) }));
    });
    if (other.parting !== null) {
      $("chart").append(svg("line", { id: "parting-line", x1: x(other.parting), x2: x(other.parting), y1: 8, y2: 165,
                                 stroke: "#d1495b", "data-round": other.parting }));
    }
  }

  async function loadCompare() {
    state.other = await api("/api/compare");
    const note = $("compare-note");
    note.hidden = false;
    note.textContent = state.other.related
      ? `dashed: ${state.other.run}; ` + (state.other.parting === null ? "the two runs say the same"
        : `their messages first differ in round ${state.other.parting} (red line)`)
      : `${state.other.run}: ${state.other.note}`;
    document.body.dataset.compared = state.other.related ? String(state.other.parting) : "unrelated";
    drawChart();
  }

  async function show(round) {
    render(await api(`/api/round/${round}`));
  }

  async function ask() {
    const question = $("ask-question").value.trim();
    if (!question || !state.panelRole) return;
    $("ask-answer").textContent = "asking …";
    try {
      const body = JSON.stringify({ role: state.panelRole, round: state.panelRound, question });
      const headers = { "Content-Type": "application/json", "X-Metaroles": "1" };
      const asked = await api("/api/interview", { method: "POST", headers, body });
      $("ask-answer").textContent = asked.answers.map((a) => `${a.role}: ${a.answer}`).join("\n");
    } catch (error) {
      $("ask-answer").textContent = `cannot ask: ${error.message}`;
    }
    document.body.dataset.asked = "yes";
  }

  async function openRole(name) {
    const panel = await api(`/api/role/${encodeURIComponent(name)}?round=${state.shown ?? 0}`);
    state.panelRole = panel.role;
    state.panelRound = panel.round;
    $("ask-answer").textContent = "";
    $("panel").hidden = false;
    $("panel-role").textContent = `${panel.role} at round ${panel.round}`;
    $("panel-todo").textContent = panel.todo || "(none)";
    for (const key of ["news", "said", "memory"]) {
      $(`panel-${key}`).replaceChildren(...panel[key].map(said));
    }
    $("panel-calls-count").textContent = panel.calls.count > panel.calls.calls.length
      ? `the newest ${panel.calls.calls.length} of ${panel.calls.count}` : String(panel.calls.count);
    $("panel-calls").replaceChildren(...panel.calls.calls.map(modelCall));
    await readState(panel.role, panel.round);
  }

  async function readState(name, round) {
    $("panel-persona").replaceChildren();
    $("panel-state").replaceChildren();
    $("panel-state-note").textContent = "reading its state (the run rebuilt in memory) …";
    try {
      const read = await api(`/api/state/${encodeURIComponent(name)}?round=${round}`);
      if (state.panelRole !== name || state.panelRound !== round) return; // another panel was opened meanwhile
      const { attributes, readings, ...counts } = read.state;
      const persona = ["profile", "goal", "constraints"].filter((key) => attributes[key]);
      $("panel-persona").replaceChildren(...fields(Object.fromEntries(persona.map((key) => [key, attributes[key]]))));
      const rest = Object.fromEntries(Object.entries(attributes).filter(([key]) => !persona.includes(key)));
      $("panel-state").replaceChildren(...fields({ ...counts, ...readings, ...rest }));
      $("panel-state-note").textContent = read.note ? `as of round ${read.as_of}: ${read.note}` : "";
    } catch (error) {
      $("panel-state-note").textContent = `its state cannot be read here: ${error.message}`;
    }
    document.body.dataset.state = `${name}@${round}`;
  }

  function fields(object) {
    return Object.entries(object).flatMap(([key, value]) => {
      const shown = typeof value === "string" ? value : JSON.stringify(value);
      return [el("dt", key), cut(el("dd"), shown)];
    });
  }

  function modelCall(call) {
    const item = el("li", undefined, "call");
    item.dataset.round = String(call.round);
    item.dataset.tokens = String(call.tokens);
    item.append(el("span", `round ${call.round} · ${call.action} · ${call.model} · ${call.tokens} tokens` +
      (call.cost ? ` · $${call.cost}` : "")));
    if (call.prompt) {
      const shown = el("details", undefined, "prompt");
      shown.append(el("summary", "prompt and answer"));
      for (const message of call.prompt) shown.append(cut(el("p", undefined, "message"), `${message.role}: ${message.content ?? ""}`));
      shown.append(cut(el("p", undefined, "answer"), `answer: ${call.answer}`));
      item.append(shown);
    }
    return item;
  }

  const LONG = 240; // characters of a message shown before "more"

  function cut(node, text) {
    if (text.length <= LONG) {
      node.append(el("span", text, "text"));
    } else {
      const more = el("details", undefined, "text");
      more.append(el("summary", `${text.slice(0, LONG)}…`), el("span", text));
      node.append(more);
    }
    return node;
  }

  function said([id, text, sender, action, answered]) {
    const item = el("li", undefined, "said");
    item.title = id;
    if (sender) item.append(roleLink(sender), el("span", ` · ${action}: `, "action"));
    if (answered) {
      item.append(el("dl", undefined, "fields"));
      item.lastChild.append(...fields(answered));
    } else if (!text) {
      item.append(el("i", "its text comes when its round is recorded"));
    } else {
      cut(item, text);
    }
    return item;
  }

  async function drawDistribution() {
    if (!$("dist-box").open) return;
    const round = state.shown ?? 0;
    const note = $("dist-note"), box = $("dist");
    note.textContent = "reading the roles (the run rebuilt in memory) …";
    let read;
    try {
      read = await api(`/api/distribution?round=${round}`);
    } catch (error) {
      box.replaceChildren();
      note.textContent = `cannot read the roles here: ${error.message}`;
      document.body.dataset.distribution = "none";
      return;
    }
    if (round !== (state.shown ?? 0)) return; // scrubbed on meanwhile: that round's comes
    box.replaceChildren();
    const names = Object.keys(read.readings);
    box.setAttribute("viewBox", `0 0 640 ${Math.max(1, names.length) * 110}`);
    names.forEach((name, i) => {
      const { edges, counts, n, mean } = read.readings[name];
      const top = 110 * i, most = Math.max(1, ...counts), width = 560 / counts.length;
      box.append(svg("text", { x: 40, y: top + 12, "font-size": 11 }, `${name}: ${n} roles, mean ${mean.toFixed(3)}`));
      counts.forEach((count, k) => {
        const height = (70 * count) / most;
        const bar = svg("rect", { x: (40 + k * width).toFixed(1), y: (top + 90 - height).toFixed(1), width: (width - 1).toFixed(1),
                                  height: height.toFixed(1), fill: COLOURS[i % COLOURS.length], class: "bin",
                                  "data-reading": name, "data-count": count, "data-low": edges[k], "data-high": edges[k + 1] });
        bar.append(svg("title", {}, `${name} ${edges[k].toPrecision(3)}–${edges[k + 1].toPrecision(3)}: ${count}`));
        box.append(bar);
      });
      box.append(svg("text", { x: 40, y: top + 104, "font-size": 10 }, edges[0].toPrecision(3)));
      box.append(svg("text", { x: 600, y: top + 104, "font-size": 10, "text-anchor": "end" }, edges[edges.length - 1].toPrecision(3)));
    });
    note.textContent = (names.length ? `${read.roles} roles after round ${read.round}` : "the roles declare no numeric readings") +
      (read.note ? ` (as of round ${read.as_of}: ${read.note})` : "");
    document.body.dataset.distribution = String(read.round);
  }

  async function openThread(id) {
    const thread = await api(`/api/thread/${encodeURIComponent(id)}`);
    const [, round, sender, action] = thread.messages[0];
    $("thread").hidden = false;
    $("thread-title").textContent = `the conversation from ${sender}'s ${action} of round ${round}`;
    $("thread-messages").replaceChildren(...thread.messages.map(([mid, at, from, act, text, answers]) => {
      const bubble = said([mid, text, from, act]);
      bubble.classList.add("bubble");
      bubble.dataset.round = String(at);
      bubble.dataset.answers = answers.join(",");
      bubble.prepend(el("small", `round ${at} `));
      return bubble;
    }));
    document.body.dataset.thread = id;
  }

  function addRound(round) {
    if (!state.rounds.includes(round)) state.rounds.push(round);
    $("scrub").max = String(state.rounds.length - 1);
  }

  function controlState(control) {
    if (!control) return;
    const paused = control.waiting_at !== null && control.waiting_at !== undefined;
    const text = paused ? `paused after round ${control.waiting_at}` : control.paused ? "pausing at the next barrier" : "running";
    $("control-state").textContent = text;
    $("control-state").className = paused ? "paused" : "";
    document.body.dataset.control = paused ? "paused" : control.paused ? "pausing" : "running";
    document.body.dataset.waitingAt = paused ? String(control.waiting_at) : "";
  }

  async function command(action, body) {
    const headers = { "X-Control-Token": state.token, "X-Controller": state.controller, "Content-Type": "application/json" };
    try {
      controlState(await api(`/api/control/${action}`, { method: "POST", headers, body: body ? JSON.stringify(body) : undefined }));
    } catch (error) {
      setStatus(String(error.message), true);
    }
  }

  function askPerson(questions) {
    const question = questions[0];
    $("people").hidden = !question || !state.controller;
    state.question = question;
    document.body.dataset.human = question ? String(question.number) : "";
    if (!question) return;
    $("human-role").textContent = question.role;
    $("human-prompt").textContent = question.prompt;
    $("human-fields").textContent = Object.entries(question.fields)
      .map(([name, values]) => `${name}: ${values.length ? values.join(" / ") : "any text"}`)
      .join("; ");
  }

  async function answerPerson() {
    if (!state.question) return;
    const headers = { "X-Control-Token": state.token, "X-Controller": state.controller, "Content-Type": "application/json" };
    const body = JSON.stringify({ number: state.question.number, text: $("human-text").value });
    try {
      await api("/api/human", { method: "POST", headers, body });
      $("human-text").value = "";
    } catch (error) {
      setStatus(String(error.message), true);
    }
  }

  async function claim(info) {
    if (!info.control) return;
    if (!state.token) {
      setStatus("watching (add the run's #token=… to the URL to steer it)");
      return;
    }
    try {
      const claimed = await api("/api/control/claim", { method: "POST", headers: { "X-Control-Token": state.token } });
      state.controller = claimed.controller;
      $("controls").hidden = false;
      document.body.dataset.controller = "yes";
      controlState(claimed);
    } catch (error) {
      setStatus(`watching only: ${error.message}`, false);
      document.body.dataset.controller = "refused";
    }
  }

  function listen(from) {
    const query = new URLSearchParams({ from: String(from), controller: state.controller });
    const source = new EventSource(`/api/stream?${query}`);
    source.addEventListener("round", (message) => {
      const delta = JSON.parse(message.data);
      addRound(delta.round);
      if ($("follow").checked) render(delta);
      loadSeries().catch(() => {}); // the new round's figures
    });
    source.addEventListener("texts", (message) => {
      const late = JSON.parse(message.data);
      if (!state.delta || state.delta.round !== late.round) return;
      for (const row of state.delta.flow) if (row[3] in late.texts) row[4] = late.texts[row[3]];
      drawFlow();
      document.body.dataset.texts = String(late.round);
    });
    source.addEventListener("control", (message) => controlState(JSON.parse(message.data)));
    source.addEventListener("human", (message) => askPerson(JSON.parse(message.data)));
    source.addEventListener("info", (message) => {
      const info = JSON.parse(message.data);
      if (info.ended) setStatus(`replay: the run ended after round ${info.rounds[info.rounds.length - 1] ?? 0}`);
    });
  }

  async function start() {
    const info = await api("/api/info");
    $("run").textContent = info.run;
    $("scenario").textContent = info.scenario;
    info.rounds.forEach(addRound);
    setStatus(info.ended ? "replay" : "live");
    await claim(info);
    const last = info.rounds[info.rounds.length - 1];
    const figures = loadSeries().then(() => (info.compare ? loadCompare() : undefined)); // beside the round
    if (last !== undefined) await show(last);
    await figures;
    listen(last === undefined ? 0 : last + 1);
    document.body.dataset.ready = "yes";
  }

  $("scrub").addEventListener("input", () => {
    $("follow").checked = false;
    const round = state.rounds[Number($("scrub").value)];
    if (round !== undefined) show(round);
  });
  for (const id of ["filter-role", "filter-action", "filter-text"]) $(id).addEventListener("input", drawFlow);
  $("ask").addEventListener("click", ask);
  $("network-box").addEventListener("toggle", () => drawNetwork().catch((error) => setStatus(error.message, true)));
  $("dist-box").addEventListener("toggle", () => drawDistribution());
  $("human-answer").addEventListener("click", answerPerson);
  $("pause").addEventListener("click", () => command("pause"));
  $("step").addEventListener("click", () => command("step"));
  $("resume").addEventListener("click", () => command("resume"));
  $("inject").addEventListener("click", () =>
    command("inject", {
      name: $("inject-name").value,
      content: $("inject-text").value,
      send_to: $("inject-to").value.split(",").map((s) => s.trim()).filter(Boolean),
    }),
  );
  start().catch((error) => setStatus(`cannot read the run: ${error.message}`, true));
})();
