// herder's dashboard: polls the master's JSON API (supervisor/views/API.md) and shows it.
// Whatever the server sends (queue names, job names, event texts) reaches the page as text
// only (textContent, createTextNode, attributes), never as markup. No inline script or style:
// the page's Content-Security-Policy allows neither.
"use strict";

(function () {
  const POLL_MS = 1000; // /api/snapshot and /api/history
  const HOSTS_MS = 5000; // /api/hosts: hosts publish every few seconds
  const RETRY_MAX_MS = 4000; // slowest retry while the master does not answer
  const FETCH_TIMEOUT_MS = 4000;
  const SPAN = 15 * 60; // seconds of history kept and charted
  const OVERLAP = 3; // seconds of history asked again each poll: the newest second's sample may be replaced
  const MAX_EVENTS = 300;
  const MIN_SPAN = 60; // seconds the time axis shows at least (a fresh page has a few samples)
  const SERIES = [
    { key: "queue_length", label: "queue", scale: "queue", color: "#1f6feb", width: 2 },
    { key: "growth", label: "growth/s", scale: "rate", color: "#54aeff", dash: [4, 3] },
    { key: "wanted", label: "wanted", scale: "workers", color: "#8c959f", dash: [6, 4] },
    { key: "running", label: "running", scale: "workers", color: "#2da44e", width: 2 },
    { key: "busy", label: "busy", scale: "workers", color: "#d4a72c", width: 2 },
    { key: "jobs_per_s", label: "jobs/s", scale: "rate", color: "#8250df" },
    { key: "failed_per_s", label: "failed/s", scale: "rate", color: "#cf222e" },
  ];
  const KINDS = ["died", "killed", "oom", "culled", "recycled", "restart", "reload", "scale", "paused",
    "resumed", "spawned", "stopped"];
  const STATES = ["starting", "running", "stopping", "paused", "idle", "busy", "killing", "exited"];

  const state = {
    snapshot: null,
    t: [], // sample times (wall-clock seconds), oldest first
    series: new Map(), // pool -> {series key -> values aligned with t}
    events: new Map(), // "id@time" -> event (ids restart with a new master: the time tells them apart)
    eventsVersion: 0,
    eventsShown: -1,
    csrf: null, // kept in memory only: a reload of the page locks it again
    unlocked: null, // the lock state the rows were built for
    failures: 0,
    lastOk: 0,
    charts: new Map(), // pool -> {plot, box, markers}
  };

  // ---- small helpers -------------------------------------------------------------------

  const $ = (id) => document.getElementById(id);

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v);
    }
    for (const c of children) node.append(c); // strings become text nodes
    return node;
  }

  function setText(node, text) {
    const s = text === null || text === undefined ? "" : String(text);
    if (node.textContent !== s) node.textContent = s;
  }

  function cssSafe(value, allowed) {
    return allowed.includes(value) ? value : "other";
  }

  const dash = "–";
  const num = (v, digits = 0) => (v === null || v === undefined ? dash : Number(v).toFixed(digits));

  function duration(s) {
    if (s === null || s === undefined) return dash;
    if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m}m ${Math.floor(s % 60)}s`;
    const h = Math.floor(m / 60);
    if (h < 48) return `${h}h ${m % 60}m`;
    return `${Math.floor(h / 24)}d ${h % 24}h`;
  }

  function bytes(n) {
    if (n === null || n === undefined) return dash;
    const mib = n / (1024 * 1024);
    return mib >= 1024 ? `${(mib / 1024).toFixed(2)} GiB` : `${mib.toFixed(1)} MiB`;
  }

  function clock(t) {
    return new Date(t * 1000).toLocaleTimeString([], { hour12: false });
  }

  // A time axis tick: the minute on a whole minute, else its seconds (":30").
  function timeTick(t) {
    const d = new Date(t * 1000);
    const two = (n) => String(n).padStart(2, "0");
    return d.getSeconds() ? `:${two(d.getSeconds())}` : `${two(d.getHours())}:${two(d.getMinutes())}`;
  }

  function signed(v, digits = 1) {
    if (v === null || v === undefined) return dash;
    return (v > 0 ? "+" : "") + v.toFixed(digits);
  }

  async function getJSON(path) {
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
    try {
      const r = await fetch(path, { cache: "no-store", signal: ctl.signal, credentials: "same-origin" });
      if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
      return await r.json();
    } finally {
      clearTimeout(timer);
    }
  }

  async function postJSON(path, body, headers) {
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
    try {
      const r = await fetch(path, {
        method: "POST",
        cache: "no-store",
        credentials: "same-origin",
        signal: ctl.signal,
        headers: Object.assign({ "Content-Type": "application/json" }, headers || {}),
        body: JSON.stringify(body),
      });
      let reply = null;
      try {
        reply = await r.json();
      } catch (e) {
        reply = null;
      }
      return { status: r.status, reply };
    } finally {
      clearTimeout(timer);
    }
  }

  function notice(text, bad) {
    const n = $("notice");
    setText(n, text);
    n.className = bad ? "notice bad" : "notice";
    n.hidden = !text;
  }

  // Rows keyed by a stable key and updated in place, so a control (an input being typed in,
  // a button being pressed) survives the next poll.
  function syncRows(tbody, items, keyOf, make, update) {
    const rows = tbody.rowsByKey || (tbody.rowsByKey = new Map());
    const seen = new Set();
    let prev = null;
    for (const item of items) {
      const key = keyOf(item);
      seen.add(key);
      let row = rows.get(key);
      if (!row) {
        row = make(item);
        row.dataset.key = key;
        rows.set(key, row);
      }
      update(row, item);
      const want = prev ? prev.nextSibling : tbody.firstChild;
      if (want !== row) tbody.insertBefore(row, want);
      prev = row;
    }
    for (const [key, row] of rows) {
      if (!seen.has(key)) {
        row.remove();
        rows.delete(key);
      }
    }
  }

  function resetRows(tbody) {
    tbody.replaceChildren();
    tbody.rowsByKey = new Map();
  }

  function cells(row, n) {
    const out = [];
    for (let i = 0; i < n; i++) out.push(row.appendChild(el("td")));
    row.cellsList = out;
    return out;
  }

  // ---- the header ----------------------------------------------------------------------

  function renderHeader(s) {
    setText($("host"), s.hostname);
    $("host").title = `host id ${s.host_id}`;
    setText($("state"), s.state);
    $("state").className = `badge state-${cssSafe(s.state, STATES)}`;
    const ok = s.health && s.health.ok;
    setText($("health"), ok ? "healthy" : "degraded");
    $("health").className = ok ? "badge good" : "badge bad";
    const reasons = (s.health && s.health.reasons) || [];
    $("reasons").replaceChildren(...reasons.map((r) => el("li", { text: r })));
    const sch = s.scheduler;
    setText($("scheduler"), sch ? `scheduler: ${sch.state}${sch.pid ? ` (pid ${sch.pid})` : ""}${sch.where ? `, ${sch.where}` : ""}` : "");
    document.title = `herder ${s.hostname}: ${ok ? "healthy" : "degraded"}`;
    setText($("version"), s.version ? `herder ${s.version}` : "");
  }

  // `herder upgrade` under way (supervisor/control/handoff.py's view): both masters, their
  // versions and how many of the old master's workers are left; hidden otherwise.
  function renderHandover(s) {
    const h = s.handover;
    const box = $("handover");
    if (!h || !h.from || !h.to) {
      box.hidden = true;
      return setText(box, "");
    }
    const left = (h.from.workers || []).length;
    const taken = (h.to.workers || []).length;
    setText(box, `upgrading: master ${h.from.pid} (herder ${h.from.version}) -> master ${h.to.pid} ` +
      `(herder ${h.to.version}): ${left} of master ${h.from.pid}'s workers left, ` +
      `${taken} started by master ${h.to.pid}`);
    box.hidden = false;
  }

  function renderConnection() {
    const live = state.failures === 0 && state.lastOk > 0;
    const c = $("conn");
    setText(c, live ? "live" : state.lastOk ? "reconnecting" : "connecting");
    c.className = `badge ${live ? "conn-live" : "conn-lost"}`;
    const u = $("updated");
    if (!state.snapshot) return setText(u, "");
    const age = Date.now() / 1000 - state.lastOk;
    setText(u, live ? `updated ${clock(state.snapshot.time)}` : `last update ${duration(age)} ago`);
  }

  // ---- controls ------------------------------------------------------------------------

  function renderAccess(s) {
    const box = $("access");
    if (!s.controls) {
      state.csrf = null;
      box.dataset.mode = "";
      box.replaceChildren(); // read-only: no form, no button anywhere
      return;
    }
    if (state.csrf) {
      if (box.dataset.mode === "unlocked") return;
      box.dataset.mode = "unlocked";
      box.replaceChildren(
        el("span", { class: "badge good", text: "controls unlocked" }),
        el("button", { type: "button", id: "lock", text: "lock", onclick: lock }),
      );
      return;
    }
    if (box.dataset.mode === "locked") return;
    box.dataset.mode = "locked";
    const input = el("input", { type: "password", id: "token", autocomplete: "off", placeholder: "operator token",
      "aria-label": "operator token" });
    const form = el("form", { id: "unlock", class: "unlock" }, input,
      el("button", { type: "submit", id: "unlock-button", text: "unlock" }));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      login(input);
    });
    box.replaceChildren(form);
  }

  async function login(input) {
    const token = input.value;
    input.value = ""; // the token is sent once and kept nowhere
    try {
      const { status, reply } = await postJSON("/api/login", { token });
      if (status === 200 && reply && typeof reply.csrf === "string") {
        state.csrf = reply.csrf;
        notice("controls unlocked", false);
      } else {
        notice((reply && reply.error) || (status === 403 ? "wrong token" : `login failed: HTTP ${status}`), true);
      }
    } catch (e) {
      notice(`login failed: ${e.message}`, true);
    }
    if (state.snapshot) render();
  }

  function lock() {
    state.csrf = null;
    notice("", false);
    if (state.snapshot) render();
  }

  async function command(body, what) {
    if (!state.csrf) return;
    try {
      const { status, reply } = await postJSON("/api/command", body, { "X-CSRF-Token": state.csrf });
      if (status === 403) {
        state.csrf = null; // a new master, or the session ended: unlock again
        notice("refused: the session is no longer valid; unlock again", true);
        render();
      } else if (reply && reply.ok) {
        notice(`${what}: done`, false);
      } else {
        notice(`${what}: ${(reply && reply.error) || `HTTP ${status}`}`, true);
      }
    } catch (e) {
      notice(`${what}: ${e.message}`, true);
    }
  }

  function poolControls(pool) {
    const n = el("input", { type: "number", min: "0", step: "1", class: "scale-n", "aria-label": `workers for ${pool}` });
    const scale = el("button", { type: "button", class: "scale", text: "scale" });
    scale.addEventListener("click", () => {
      const workers = parseInt(n.value, 10);
      if (Number.isNaN(workers)) return notice("scale: give a number of workers", true);
      command({ cmd: "scale", pool, workers }, `scale ${pool} to ${workers}`);
    });
    const pause = el("button", { type: "button", class: "pause", text: "pause" });
    pause.addEventListener("click", () => {
      const cmd = pause.dataset.cmd || "pause";
      command({ cmd, pool }, `${cmd} ${pool}`);
    });
    const restart = el("button", { type: "button", class: "restart", text: "restart" });
    restart.addEventListener("click", () => command({ cmd: "restart", pool }, `rolling restart of ${pool}`));
    return el("span", { class: "controls" }, n, scale, pause, restart);
  }

  // ---- pools ---------------------------------------------------------------------------

  function renderPools(s) {
    const tbody = $("pools").tBodies[0];
    $("no-pools").hidden = s.pools.length > 0;
    syncRows(tbody, s.pools, (p) => p.name,
      (p) => {
        const row = el("tr");
        const c = cells(row, 14);
        if (state.csrf) c[13].append(poolControls(p.name));
        return row;
      },
      (row, p) => {
        const c = row.cellsList;
        setText(c[0], p.name);
        setText(c[1], p.state);
        c[1].className = `state-${cssSafe(p.state, STATES)}`;
        setText(c[2], `${p.min}..${p.max}${p.autoscale ? " auto" : ""}`);
        setText(c[3], p.wanted);
        setText(c[4], p.running);
        setText(c[5], p.busy);
        setText(c[6], num(p.queue_length));
        setText(c[7], p.growth === null ? dash : `${signed(p.growth)}/s`);
        setText(c[8], duration(p.oldest_age));
        setText(c[9], num(p.jobs_per_s, 1));
        setText(c[10], num(p.failed_per_s, 1));
        c[10].className = p.failed_per_s > 0 ? "bad-text" : "";
        setText(c[11], `${p.jobs_ok} / ${p.jobs_failed}`);
        setText(c[12], (p.queues || []).join(", "));
        const pause = row.querySelector("button.pause");
        if (pause) {
          pause.dataset.cmd = p.state === "paused" ? "resume" : "pause";
          setText(pause, pause.dataset.cmd);
        }
        const n = row.querySelector("input.scale-n");
        if (n && document.activeElement !== n && !n.value) n.placeholder = String(p.wanted);
      });
  }

  // ---- workers -------------------------------------------------------------------------

  function jobCell(cell, w) {
    const parts = [];
    const all = w.threads || [];
    const threads = all.length > 1 || !w.job ? all : []; // one thread running the worker's job: said already
    if (threads.length) {
      parts.push(el("span", { class: "muted", text: `${threads.length} job${threads.length === 1 ? "" : "s"} in threads` }));
    } else if (w.job) {
      parts.push(el("span", { class: "func", text: w.func || "(unknown function)" }));
      parts.push(el("span", { class: "muted job-id", text: ` ${w.job}` }));
    }
    if (threads.length) {
      parts.push(el("ul", { class: "threads" },
        ...threads.map((th) => el("li", { text: `thread ${th.thread}: ${th.func || "(unknown function)"} ${th.job} · ${duration(th.elapsed)}` }))));
    }
    // Why it does not work yet: it waits (for Redis, say), and for how long.
    const waiting = !parts.length && w.waiting_for ? `waiting ${duration(Math.round(w.waiting_seconds || 0))} for ${w.waiting_for}` : null;
    if (waiting) parts.push(el("span", { class: "waiting", text: waiting }));
    if (!parts.length) parts.push(dash);
    const sig = JSON.stringify([w.job, w.func, threads.map((th) => [th.thread, th.job, Math.floor(th.elapsed)]), waiting]);
    if (cell.dataset.sig !== sig) {
      cell.dataset.sig = sig;
      cell.replaceChildren(...parts);
    }
  }

  function elapsedCell(cell, w) {
    if (w.elapsed === null || w.elapsed === undefined) {
      if (cell.dataset.kind !== "none") {
        cell.dataset.kind = "none";
        cell.replaceChildren(dash);
      }
      return;
    }
    if (cell.dataset.kind !== "some") {
      cell.dataset.kind = "some";
      cell.replaceChildren(el("meter", { min: "0", low: "0.5", high: "0.8", optimum: "0" }), el("span"));
    }
    const [meter, text] = cell.children;
    const timeout = w.timeout || 0;
    meter.hidden = !timeout;
    if (timeout) {
      meter.max = timeout;
      meter.value = Math.min(w.elapsed, timeout);
      meter.low = timeout * 0.5;
      meter.high = timeout * 0.8;
    }
    setText(text, timeout ? ` ${duration(w.elapsed)} / ${duration(timeout)}` : ` ${duration(w.elapsed)}`);
  }

  function renderWorkers(s) {
    const tbody = $("workers").tBodies[0];
    setText($("worker-count"), `(${s.workers.length})`);
    syncRows(tbody, s.workers, (w) => `${w.pid}`,
      (w) => {
        const row = el("tr");
        const c = cells(row, 12);
        if (state.csrf) {
          const stop = el("button", { type: "button", class: "stop", text: "stop" });
          stop.addEventListener("click", () => command({ cmd: "stop_worker", pid: w.pid }, `stop worker ${w.pid}`));
          c[11].append(stop);
        }
        return row;
      },
      (row, w) => {
        const c = row.cellsList;
        row.dataset.pid = w.pid;
        row.dataset.pool = w.pool;
        setText(c[0], w.pool);
        setText(c[1], w.slot);
        setText(c[2], w.pid);
        setText(c[3], w.state);
        c[3].className = `state-${cssSafe(w.state, STATES)}`;
        jobCell(c[4], w);
        elapsedCell(c[5], w);
        setText(c[6], w.jobs_done);
        setText(c[7], w.jobs_failed);
        setText(c[8], bytes(w.rss));
        setText(c[9], w.cpu_percent === null || w.cpu_percent === undefined ? dash : `${w.cpu_percent.toFixed(0)}%`);
        setText(c[10], duration(w.uptime));
      });
  }

  // ---- events --------------------------------------------------------------------------

  function addEvents(list) {
    let added = false;
    for (const e of list || []) {
      const key = `${e.id}@${e.time}`;
      if (!state.events.has(key)) {
        state.events.set(key, e);
        added = true;
      }
    }
    if (!added) return;
    const sorted = [...state.events.entries()].sort((a, b) => b[1].time - a[1].time || b[1].id - a[1].id);
    state.events = new Map(sorted.slice(0, MAX_EVENTS * 2)); // the newest; the chart shows 15 minutes of them
    state.eventsVersion++;
  }

  function newestEvents() {
    return [...state.events.values()]; // kept newest first
  }

  function syncOptions(select, values) {
    const have = [...select.options].slice(1).map((o) => o.value);
    if (have.join("\u0000") === values.join("\u0000")) return;
    const chosen = select.value;
    select.replaceChildren(select.options[0], ...values.map((v) => el("option", { value: v, text: v })));
    select.value = values.includes(chosen) ? chosen : "";
  }

  function renderEvents() {
    const events = newestEvents();
    const pools = [...new Set([...(state.snapshot ? state.snapshot.pools.map((p) => p.name) : []),
      ...events.map((e) => e.pool)])].filter((p) => p).sort();
    syncOptions($("event-pool"), pools);
    syncOptions($("event-kind"), [...new Set(events.map((e) => e.kind))].sort());
    const pool = $("event-pool").value;
    const kind = $("event-kind").value;
    const sig = `${state.eventsVersion}|${pool}|${kind}`;
    if (state.eventsShown === sig) return;
    state.eventsShown = sig;
    const shown = events.filter((e) => (!pool || e.pool === pool) && (!kind || e.kind === kind)).slice(0, MAX_EVENTS);
    setText($("event-count"), `${shown.length} shown`);
    $("events").replaceChildren(...shown.map((e) => el("li",
      { class: `event kind-${cssSafe(e.kind, KINDS)}`, "data-id": String(e.id), "data-kind": e.kind,
        "data-pid": e.pid === null || e.pid === undefined ? "" : String(e.pid) },
      el("time", { text: clock(e.time) }),
      el("span", { class: "kind", text: e.kind }),
      el("span", { class: "pool", text: e.pool }),
      el("span", { class: "text", text: e.text }))));
  }

  // ---- history and charts --------------------------------------------------------------

  function emptySeries(n) {
    const out = {};
    for (const s of SERIES) out[s.key] = new Array(n).fill(null);
    return out;
  }

  function mergeHistory(h) {
    const step = h.step || 1;
    const pools = h.pools || {};
    for (const name of Object.keys(pools)) {
      if (!state.series.has(name)) state.series.set(name, emptySeries(state.t.length));
    }
    const t = h.t || [];
    for (let i = 0; i < t.length; i++) {
      const second = Math.floor(t[i] / step);
      let at = -1; // the index of this second's sample, if we have it
      for (let j = state.t.length - 1; j >= 0 && j >= state.t.length - 2 * OVERLAP - 2; j--) {
        if (Math.floor(state.t[j] / step) === second) {
          at = j;
          break;
        }
      }
      if (at < 0) {
        if (state.t.length && t[i] < state.t[state.t.length - 1]) continue; // older than what we have
        at = state.t.length;
        state.t.push(t[i]);
        for (const s of state.series.values()) for (const k of SERIES) s[k.key].push(null);
      } else {
        state.t[at] = t[i]; // the newest sample of that second
      }
      for (const [name, s] of state.series) {
        const p = pools[name];
        for (const k of SERIES) s[k.key][at] = p && p[k.key] ? p[k.key][i] : null;
      }
    }
    // keep 15 minutes
    const newest = state.t.length ? state.t[state.t.length - 1] : 0;
    let drop = 0;
    while (drop < state.t.length && state.t[drop] < newest - SPAN) drop++;
    if (drop) {
      state.t.splice(0, drop);
      for (const s of state.series.values()) for (const k of SERIES) s[k.key].splice(0, drop);
    }
  }

  function chartWidth(box) {
    return Math.max(320, box.clientWidth || 600);
  }

  function makeChart(pool) {
    const box = el("div", { class: "chart", "data-pool": pool });
    box.append(el("h3", { text: pool }));
    const plotBox = el("div", { class: "plot" });
    box.append(plotBox);
    $("charts").append(box);
    const entry = { box, plot: null, markers: el("div", { class: "markers" }), tip: el("div", { class: "tip", hidden: "" }) };
    const axis = { stroke: "#57606a", grid: { stroke: "#eaeef2", width: 1 }, ticks: { stroke: "#d0d7de", width: 1 } };
    const opts = {
      width: chartWidth(box),
      height: 220,
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true, range: (u, lo, hi) => [Math.min(lo, hi - MIN_SPAN), hi] }, workers: { range: (u, lo, hi) => [0, Math.max(2, hi + 1)] },
        queue: { range: (u, lo, hi) => [0, Math.max(5, hi * 1.1)] }, rate: { range: (u, lo, hi) => [Math.min(0, lo * 1.1), Math.max(1, hi * 1.1)] } },
      series: [{ label: "time", value: (u, v) => (v === null ? dash : clock(v)) }, ...SERIES.map((s) => ({
        label: s.label, scale: s.scale, stroke: s.color, width: s.width || 1.5, dash: s.dash, spanGaps: false,
        value: (u, v) => (v === null || v === undefined ? dash : Number.isInteger(v) ? String(v) : v.toFixed(2)),
      }))],
      axes: [
        Object.assign({ values: (u, ticks) => ticks.map(timeTick), space: 50 }, axis),
        Object.assign({ scale: "workers", label: "workers", size: 44 }, axis),
        Object.assign({ scale: "queue", label: "queue", side: 1, size: 56 }, axis, { grid: { show: false } }),
        Object.assign({ scale: "rate", label: "per s", side: 1, size: 48 }, axis, { grid: { show: false } }),
      ],
      hooks: { draw: [(u) => placeMarkers(pool, entry, u)] },
    };
    entry.plot = new uPlot(opts, chartData(pool), plotBox);
    entry.plot.over.append(entry.markers, entry.tip);
    state.charts.set(pool, entry);
    return entry;
  }

  function chartData(pool) {
    const s = state.series.get(pool) || emptySeries(state.t.length);
    return [state.t.slice(), ...SERIES.map((k) => s[k.key].slice())];
  }

  // Every event of this pool (or of the whole host) in the chart's span, as a marker on the
  // time axis: a vertical line colored by kind, its text on hover.
  function placeMarkers(pool, entry, u) {
    const [lo, hi] = [u.scales.x.min, u.scales.x.max];
    const poolNames = state.snapshot ? state.snapshot.pools.map((p) => p.name) : [];
    const want = newestEvents().filter((e) => e.time >= lo && e.time <= hi && (e.pool === pool || !poolNames.includes(e.pool)));
    const have = entry.markerByKey || (entry.markerByKey = new Map());
    const seen = new Set();
    const width = u.over.clientWidth;
    for (const e of want) {
      const key = `${e.id}@${e.time}`;
      seen.add(key);
      let m = have.get(key);
      if (!m) {
        m = el("div", { class: `marker kind-${cssSafe(e.kind, KINDS)}`, title: `${clock(e.time)} ${e.kind}: ${e.text}`,
          "data-id": String(e.id), "data-kind": e.kind, "data-text": e.text,
          "data-pid": e.pid === null || e.pid === undefined ? "" : String(e.pid) });
        m.addEventListener("mouseenter", () => showTip(entry, m, e));
        m.addEventListener("mouseleave", () => (entry.tip.hidden = true));
        have.set(key, m);
        entry.markers.append(m);
      }
      const x = u.valToPos(e.time, "x");
      m.style.left = `${Math.max(0, Math.min(width - 1, x)) - 1}px`;
    }
    for (const [key, m] of have) {
      if (!seen.has(key)) {
        m.remove();
        have.delete(key);
      }
    }
    entry.box.dataset.markers = String(have.size);
    entry.box.dataset.samples = String(u.data[0].length);
  }

  function showTip(entry, marker, e) {
    const tip = entry.tip;
    tip.replaceChildren(el("strong", { text: `${e.kind} ` }), el("span", { text: `${clock(e.time)} ${e.text}` }));
    tip.className = `tip kind-${cssSafe(e.kind, KINDS)}`;
    tip.hidden = false;
    const left = parseFloat(marker.style.left) || 0;
    const w = entry.plot.over.clientWidth;
    tip.style.left = left > w / 2 ? "" : `${left + 6}px`;
    tip.style.right = left > w / 2 ? `${w - left + 6}px` : "";
  }

  function renderCharts(s) {
    const pools = s.pools.map((p) => p.name);
    for (const [name, entry] of state.charts) {
      if (!pools.includes(name)) {
        entry.plot.destroy();
        entry.box.remove();
        state.charts.delete(name);
      }
    }
    for (const name of pools) {
      const entry = state.charts.get(name) || makeChart(name);
      entry.plot.setData(chartData(name));
    }
    // keep the order of the pools
    for (const name of pools) $("charts").append(state.charts.get(name).box);
  }

  function renderKinds() {
    if ($("kinds").children.length) return;
    $("kinds").replaceChildren(...KINDS.map((k) => el("li", { class: `kind-${k}` }, el("i", { class: "swatch" }), k)));
  }

  // ---- advice --------------------------------------------------------------------------

  function renderAdvice(s) {
    const advice = s.advice || [];
    $("no-advice").hidden = advice.length > 0;
    syncRows($("advice").tBodies[0], advice, (a) => `${a.pool}\u0000${a.kind}\u0000${a.reason}`,
      () => {
        const row = el("tr");
        cells(row, 5);
        return row;
      },
      (row, a) => {
        const c = row.cellsList;
        const change = Object.entries(a.change || {});
        row.className = change.length ? "advice-change" : "advice-finding muted";
        setText(c[0], a.pool);
        setText(c[1], a.kind);
        setText(c[2], a.text);
        setText(c[3], change.length ? change.map(([k, v]) => `${k} = ${v}`).join(", ") : dash);
        const sure = a.confidence || {};
        setText(c[4], `${sure.jobs} jobs, ${num(sure.minutes, 1)} min`);
      });
  }

  // ---- hosts ---------------------------------------------------------------------------

  function renderHosts(h) {
    const hosts = (h && h.hosts) || [];
    syncRows($("hosts").tBodies[0], hosts, (x) => x.host_id,
      () => {
        const row = el("tr");
        cells(row, 7);
        return row;
      },
      (row, x) => {
        const c = row.cellsList;
        row.className = x.this ? "this-host" : "";
        setText(c[0], x.this ? `${x.hostname} (this host)` : x.hostname);
        setText(c[1], x.host_id);
        setText(c[2], x.health);
        setText(c[3], (x.pools || []).join(", "));
        setText(c[4], x.running);
        setText(c[5], x.busy);
        setText(c[6], `${duration(x.last_seen)} ago`);
      });
  }

  // ---- the loop ------------------------------------------------------------------------

  function render() {
    const s = state.snapshot;
    if (!s) return;
    if (state.unlocked !== Boolean(state.csrf)) {
      state.unlocked = Boolean(state.csrf); // rows are built with or without their controls
      resetRows($("pools").tBodies[0]);
      resetRows($("workers").tBodies[0]);
      document.body.classList.toggle("unlocked", state.unlocked);
    }
    renderHeader(s);
    renderHandover(s);
    renderAccess(s);
    renderPools(s);
    renderAdvice(s);
    renderWorkers(s);
    addEvents(s.events);
    renderEvents();
    renderCharts(s);
    renderConnection();
  }

  async function poll() {
    try {
      const since = state.t.length ? `?since=${state.t[state.t.length - 1] - OVERLAP}` : "";
      const [snap, hist] = await Promise.all([getJSON("/api/snapshot"), getJSON(`/api/history${since}`)]);
      mergeHistory(hist);
      addEvents(hist.events);
      state.snapshot = snap;
      state.failures = 0;
      state.lastOk = Date.now() / 1000;
      render();
    } catch (e) {
      state.failures++;
      renderConnection();
    }
    const wait = state.failures ? Math.min(RETRY_MAX_MS, POLL_MS * state.failures) : POLL_MS;
    setTimeout(poll, wait);
  }

  async function pollHosts() {
    try {
      renderHosts(await getJSON("/api/hosts"));
    } catch (e) {
      // the snapshot poll says whether the master answers
    }
    setTimeout(pollHosts, HOSTS_MS);
  }

  function start() {
    renderKinds();
    $("event-pool").addEventListener("change", renderEvents);
    $("event-kind").addEventListener("change", renderEvents);
    let resizing = 0;
    window.addEventListener("resize", () => {
      clearTimeout(resizing);
      resizing = setTimeout(() => {
        for (const entry of state.charts.values()) entry.plot.setSize({ width: chartWidth(entry.box), height: 220 });
      }, 100);
    });
    poll();
    pollHosts();
  }

  // For tests and the curious: the page's state, read-only by convention.
  window.herderDashboard = { state, charts: state.charts };
  start();
})();
