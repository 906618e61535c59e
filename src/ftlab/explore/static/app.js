// ftlab explore: the page's controls, its requests to the local server and its plots (plotly.js).
// Every number drawn comes from the server's JSON, unrounded; the page only formats what it shows as text
// (the full value stays in each cell's data-value attribute).
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);

  // kind: "lin" (slider = value), "log" (slider = log10 value), "log0" (log10, with 0 at the left end).
  const KNOBS = [
    { name: "c", label: "c", group: "init", kind: "log", min: -6, max: 1, help: "PT absolute init scale (> 0)" },
    { name: "lam", label: "λ", group: "init", kind: "lin", min: -1, max: 1, step: 0.001,
      help: "PT relative scale of the first layer vs the readout, in [-1, 1]" },
    { name: "gamma", label: "γ", group: "init", kind: "log0", min: -4, max: 1, help: "FT readout re-initialization scale (≥ 0)" },
    { name: "beta_pt", label: "|β_PT|", group: "eval", kind: "log", min: -3, max: 3, help: "what PT learned on the coordinate" },
    { name: "beta_ft", label: "|β_FT|", group: "eval", kind: "log", min: -3, max: 3, help: "what FT must reach on the coordinate" },
    { name: "rho_pt", label: "ρ_PT", group: "task", kind: "lin", min: 0, max: 1, step: 0.005, help: "PT teacher sparsity" },
    { name: "rho_ft", label: "ρ_FT", group: "task", kind: "lin", min: 0, max: 1, step: 0.005, help: "FT teacher sparsity" },
    { name: "overlap", label: "overlap ω", group: "task", kind: "lin", min: 0, max: 1, step: 0.005,
      help: "|S_PT ∩ S_FT| / |S_FT|" },
    { name: "alpha", label: "α", group: "task", kind: "lin", min: 0.01, max: 1, step: 0.005, help: "FT samples per dimension N_FT / D" },
  ];
  const POINT_KNOBS = new Set(["c", "lam", "gamma", "beta_pt", "beta_ft"]);
  const CURVE_KNOBS = new Set(["c", "lam", "gamma", "rho_pt", "rho_ft", "overlap", "alpha"]);
  const TASK_KNOBS = new Set(["rho_pt", "rho_ft", "overlap"]);
  const ORDER = ["I", "II", "III", "IV"];
  const CONFIG = { displaylogo: false, responsive: true };
  const FONT = { size: 11 };

  const state = {};          // knob -> the text sent to the server (as typed or as set by a slider)
  const busy = {}, dirty = {}, since = {};
  const timings = { point: [], curve: [], corners: [] };
  const messages = {};       // source -> {text, level}
  const last = { point: null, curve: null, corners: null, advice: null, sim: null };
  let meta = null;

  // ---- knobs: slider <-> value ---------------------------------------------------------------------
  function toSlider(k, v) {
    if (k.kind === "lin") return v;
    if (k.kind === "log0" && v === 0) return k.min - 0.1;
    return Math.log10(v);
  }
  function fromSlider(k, p) {
    if (k.kind === "lin") return Number(p.toFixed(Math.max(0, -Math.floor(Math.log10(k.step)))));
    if (k.kind === "log0" && p < k.min) return 0;
    return Number((10 ** p).toPrecision(3));
  }
  function sliderOk(k, v) { return Number.isFinite(v) && (k.kind === "lin" || v > 0 || (k.kind === "log0" && v === 0)); }

  function buildKnobs() {
    for (const k of KNOBS) {
      const row = document.createElement("div");
      row.className = "knob";
      const lo = k.kind === "log0" ? k.min - 0.1 : k.min;
      const step = k.kind === "lin" ? k.step : 0.01;
      row.innerHTML = `<label for="s-${k.name}" title="${k.help}">${k.label}</label>` +
        `<input id="s-${k.name}" type="range" min="${lo}" max="${k.max}" step="${step}" title="${k.help}">` +
        `<input id="t-${k.name}" type="text" inputmode="decimal" spellcheck="false" title="${k.help}">`;
      $(`group-${k.group}`).appendChild(row);
      const slider = $(`s-${k.name}`), text = $(`t-${k.name}`);
      slider.addEventListener("input", () => {
        const v = fromSlider(k, Number(slider.value));
        text.value = String(v);
        setKnob(k.name, String(v));
      });
      text.addEventListener("change", () => {
        const v = Number(text.value.trim());
        if (sliderOk(k, v)) slider.value = String(toSlider(k, v));
        setKnob(k.name, text.value.trim());
      });
    }
  }

  function showKnob(name, text) {
    const k = KNOBS.find((x) => x.name === name);
    $(`t-${name}`).value = text;
    const v = Number(text);
    if (sliderOk(k, v)) $(`s-${name}`).value = String(toSlider(k, v));
  }

  function query() { return new URLSearchParams(state).toString(); }

  function setKnob(name, text) {
    state[name] = text;
    history.replaceState(null, "", "#" + query());
    if (POINT_KNOBS.has(name)) schedule("point");
    if (CURVE_KNOBS.has(name)) schedule("curve");
    if (TASK_KNOBS.has(name)) schedule("corners");
    drawSimStatus();
  }

  // ---- requests: at most one in flight per kind; changes made meanwhile are sent once it returns -----
  function schedule(kind) {
    if (since[kind] == null) since[kind] = performance.now();
    if (busy[kind]) dirty[kind] = true; else run(kind);
  }

  const nextFrame = () => new Promise((resolve) => requestAnimationFrame(() => resolve()));

  async function run(kind) {
    busy[kind] = true;
    dirty[kind] = false;
    const t0 = since[kind];
    since[kind] = null;
    let ok = false;
    try {
      const res = await fetch(`/api/${kind}?${query()}`);
      const body = await res.json();
      if (res.ok) {
        last[kind] = body;
        await DRAW[kind]();
        setMessage(kind, body.warning || null, "warning");
        ok = true;
      } else {
        setMessage(kind, body.error || `the server answered ${res.status}`, "error");
      }
    } catch (err) {
      setMessage(kind, `no answer from the local server (${err.message}); is ftlab explore still running?`, "error");
    }
    await nextFrame();
    timings[kind].push({ ms: performance.now() - t0, ok });
    showTimings();
    busy[kind] = false;
    if (dirty[kind]) run(kind);
  }

  function setMessage(source, text, level) {
    if (text) messages[source] = { text, level }; else delete messages[source];
    const seen = new Set(), box = $("message");
    box.replaceChildren();
    for (const { text: t, level: l } of Object.values(messages)) {
      if (seen.has(t)) continue;
      seen.add(t);
      const div = document.createElement("div");
      div.className = l;
      div.textContent = t;
      box.appendChild(div);
    }
    // outline the text box of the knob an error names ("c=-1.0 is out of range: ...")
    const named = Object.values(messages).filter((m) => m.level === "error").map((m) => m.text.split("=")[0]);
    for (const k of KNOBS) $(`t-${k.name}`).classList.toggle("bad", named.includes(k.name));
  }

  function showTimings() {
    const med = (xs) => { const s = xs.map((x) => x.ms).sort((a, b) => a - b); return s.length ? s[s.length >> 1] : NaN; };
    const lastOf = (xs) => (xs.length ? xs[xs.length - 1].ms : NaN);
    $("timing").textContent = `redraw after a change (last / median): metrics and maps ${lastOf(timings.point).toFixed(0)} / ` +
      `${med(timings.point).toFixed(0)} ms, learning curve ${lastOf(timings.curve).toFixed(0)} / ${med(timings.curve).toFixed(0)} ms`;
  }

  // ---- formatting ---------------------------------------------------------------------------------------
  function fmt(v, digits = 4) {
    if (v === null || v === undefined) return "—";
    if (typeof v !== "number") return String(v);
    if (v === 0) return "0";
    const a = Math.abs(v);
    return a >= 1e-3 && a < 1e4 ? String(Number(v.toPrecision(digits))) : v.toExponential(digits - 1);
  }
  function cell(id, v, text) {
    const el = $(id);
    el.dataset.value = v === null || v === undefined ? "" : String(v);
    el.textContent = text ?? fmt(v);
  }

  // ---- drawing --------------------------------------------------------------------------------------------
  const DRAW = {
    point: drawPoint,
    curve: drawCurve,
    corners: drawCurve,
  };

  function axisTitle(text) { return { text, font: FONT }; }

  async function drawPoint() {
    const p = last.point, m = p.metrics;
    for (const key of ["l_order", "pd", "m", "l_plus_pd", "k"]) cell(`v-${key}`, m[key]);
    cell("v-regime", m.regime, `${m.regime}: ${m.regime_name}`);
    $("v-regime").style.color = meta.colors[m.regime];
    await Promise.all([drawPlane(p), drawPhase(p), drawQk(p)]);
  }

  // Static decorations (regions, labels) and the phase map's star are HTML/SVG under or over the plots, placed
  // on the plot area, which fixed axis ranges and margins make known: moving a knob then redraws only what moved.
  const PLANE_X = [0.97, 2.03], PLANE_Y = [-1.03, 0.05], PLANE_MARGIN = { l: 55, r: 10, t: 32, b: 40 };
  const PHASE_X = [-1.02, 1.02], PHASE_Y = [-6.1, 1.1], PHASE_MARGIN = { l: 50, r: 10, t: 32, b: 40 };
  const TRANSPARENT = { paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)" };
  const pct = (v, [lo, hi], flip) => `${(flip ? (hi - v) : (v - lo)) / (hi - lo) * 100}`;

  function placeArea(id, m) { Object.assign($(id).style, { left: `${m.l}px`, right: `${m.r}px`, top: `${m.t}px`, bottom: `${m.b}px` }); }

  function buildOverlays() {
    placeArea("plane-area", PLANE_MARGIN);
    placeArea("phase-area", PHASE_MARGIN);
    const x = (v) => pct(v, PLANE_X, false), y = (v) => pct(v, PLANE_Y, true);
    const rect = (name, x0, x1, y0, y1) => `<rect x="${x(x0)}" y="${y(y1)}" width="${x(x1) - x(x0)}" height="${y(y0) - y(y1)}" ` +
      `fill="${meta.colors[name]}" fill-opacity="0.12"/>`;
    const svg = `<svg viewBox="0 0 100 100" preserveAspectRatio="none">${rect("I", 1, 1.5, -0.1, 0)}${rect("IV", 1, 1.5, -1, -0.1)}` +
      `${rect("II", 1.5, 2, -1, -0.1)}${rect("III", 1.5, 2, -0.1, 0)}` +
      `<path d="M ${x(1)} ${y(0)} L ${x(2)} ${y(-1)} L ${x(1)} ${y(-1)} Z" fill="#888" fill-opacity="0.25"/></svg>`;
    const label = (text, lx, ly, cls = "") => `<span class="${cls}" style="left:${x(lx)}%;top:${y(ly)}%;` +
      `color:${meta.colors[text] || "#555"}">${text}</span>`;
    $("plane-area").innerHTML = svg + label("I", 1.25, -0.04) + label("II", 1.75, -0.7) + label("III", 1.75, -0.04) +
      label("IV", 1.12, -0.55) + label("unreachable: ℓ + PD < 1", 1.25, -0.85, "note");
  }

  function drawPlane(p) {
    const colors = meta.colors;
    const corners = ORDER.map((name) => {
      const c = p.corners[name];
      return { uid: `corner-${name}`, type: "scatter", mode: "markers+text", x: [c.l_order], y: [c.pd], text: [name],
        textposition: "top right", marker: { size: 10, color: colors[name], symbol: "diamond", line: { width: 1, color: "#fff" } },
        name: `corner ${name} (c=${fmt(c.c)}, λ=${fmt(c.lam)}, γ=${fmt(c.gamma)})`, showlegend: false };
    });
    const traces = [
      { uid: "lam-path", type: "scatter", mode: "lines", x: p.lam_path.l_order, y: p.lam_path.pd,
        line: { color: "#444", width: 1.5 }, name: "λ from −1 to 1 (this c, γ)" },
      { uid: "c-path", type: "scatter", mode: "lines", x: p.c_path.l_order, y: p.c_path.pd,
        line: { color: "#444", width: 1, dash: "dot" }, name: "c from 1e-6 to 10 (this λ, γ)" },
      ...corners,
      { uid: "current", type: "scatter", mode: "markers", x: [p.metrics.l_order], y: [p.metrics.pd], name: "current knobs",
        marker: { size: 15, symbol: "star", color: "#111" } },
    ];
    const layout = { title: { text: "Regime map: PD against ℓ-order", font: { size: 13 } }, font: FONT, ...TRANSPARENT,
      xaxis: { title: axisTitle("ℓ-order (1 rich, 2 lazy)"), range: PLANE_X, zeroline: false, automargin: false },
      yaxis: { title: axisTitle("PD (0 PT-independent, −1 PT-dependent)"), range: PLANE_Y, zeroline: false, automargin: false },
      legend: { x: 0.99, xanchor: "right", y: 0.85, bgcolor: "rgba(255,255,255,0.7)", font: { size: 10 } },
      hovermode: "closest", margin: PLANE_MARGIN };
    return Plotly.react("plane", traces, layout, CONFIG);
  }

  // The regime map over (λ, c) depends on γ, |β_PT|, |β_FT| only: it is redrawn when they change; c and λ move the star.
  let phaseKey = null;

  function placeStar(k) {
    const fx = (k.lam - PHASE_X[0]) / (PHASE_X[1] - PHASE_X[0]), fy = (Math.log10(k.c) - PHASE_Y[0]) / (PHASE_Y[1] - PHASE_Y[0]);
    const star = $("phase-star");
    star.hidden = !(fx >= 0 && fx <= 1 && fy >= 0 && fy <= 1);
    Object.assign(star.style, { left: `${fx * 100}%`, top: `${(1 - fy) * 100}%` });
  }

  function drawPhase(p) {
    const k = p.knobs;
    const key = JSON.stringify([k.gamma, k.beta_pt, k.beta_ft]);
    placeStar(k);
    if (phaseKey === key) return null;
    phaseKey = key;
    const colors = ORDER.map((n) => meta.colors[n]);
    const scale = [];
    colors.forEach((c, i) => { scale.push([i / 4, c], [(i + 1) / 4, c]); });
    const names = p.phase.regime.map((row) => row.map((v) => (v === null ? "" : ORDER[v])));
    const traces = [
      { uid: "phase", type: "heatmap", x: p.phase.lam, y: p.phase.log10_c, z: p.phase.regime, zmin: -0.5, zmax: 3.5,
        colorscale: scale, opacity: 0.75, hoverongaps: false, customdata: names, showscale: false,
        hovertemplate: "λ=%{x:.3f}, log10 c=%{y:.2f}: %{customdata}<extra></extra>" },
    ];
    const key4 = ORDER.map((n) => `<span style="color:${meta.colors[n]}">■ ${n}</span>`).join(" ");
    const layout = { title: { text: `Regime ${key4} over (λ, c) at γ = ${fmt(k.gamma)}, |β_PT| = ${fmt(k.beta_pt)}, ` +
      `|β_FT| = ${fmt(k.beta_ft)}`, font: { size: 13 } }, font: FONT,
    xaxis: { title: axisTitle("λ (first layer vs readout at PT init)"), zeroline: false, range: PHASE_X, automargin: false },
    yaxis: { title: axisTitle("log10 c"), zeroline: false, range: PHASE_Y, automargin: false }, margin: PHASE_MARGIN };
    return Plotly.react("phase", traces, layout, CONFIG);
  }

  function drawQk(p) {
    const q = p.qk, k = p.knobs;
    const traces = [
      { uid: "qk-active", type: "scatter", mode: "lines", x: q.z, y: q.active, line: { color: "#111", width: 2 },
        name: `PT-active coordinate, |β_PT| = ${fmt(k.beta_pt)} (k = ${fmt(q.k_active, 3)})` },
      { uid: "qk-inactive", type: "scatter", mode: "lines", x: q.z, y: q.inactive, line: { color: "#888", width: 2, dash: "dash" },
        name: `PT-inactive coordinate, β_PT = 0 (k = ${fmt(q.k_inactive, 3)})` },
    ];
    if (q.at.z > 0 && q.at.q > 0) {
      const zs = [q.at.z / 30, q.at.z * 30];
      traces.push(
        { uid: "slope-1", type: "scatter", mode: "lines", x: zs, y: zs.map((z) => q.at.q * (z / q.at.z)), line: { color: "#4c72b0", width: 1, dash: "dot" },
          name: "slope 1 (ℓ1, rich)" },
        { uid: "slope-2", type: "scatter", mode: "lines", x: zs, y: zs.map((z) => q.at.q * (z / q.at.z) ** 2), line: { color: "#55a868", width: 1, dash: "dot" },
          name: "slope 2 (ℓ2, lazy)" },
        { uid: "qk-at", type: "scatter", mode: "markers", x: [q.at.z], y: [q.at.q], marker: { size: 10, color: "#111" },
          name: `|β_FT| = ${fmt(k.beta_ft)}: local slope ℓ = ${fmt(p.metrics.l_order)}` });
    }
    const layout = { title: { text: "Implicit-bias potential q_k(β) per coordinate (log-log: slope = ℓ-order)", font: { size: 13 } },
      font: FONT, xaxis: { title: axisTitle("|β|"), type: "log", exponentformat: "power" },
      yaxis: { title: axisTitle("q_k(β)"), type: "log", exponentformat: "power" },
      legend: { x: 0.01, y: 0.99, bgcolor: "rgba(255,255,255,0.7)", font: { size: 10 } }, margin: { l: 55, r: 10, t: 32, b: 40 } };
    return Plotly.react("qk", traces, layout, CONFIG);
  }

  function sameKnobs(a) { return a && KNOBS.every((k) => k.name.startsWith("beta") || Number(a[k.name]) === Number(state[k.name])); }

  async function drawCurve() {
    const traces = [];
    const colors = meta.colors;
    if (last.corners) {
      for (const name of ORDER) {
        const c = last.corners[name];
        traces.push({ uid: `corner-${name}`, type: "scatter", mode: "lines", x: c.alphas, y: c.error, line: { color: colors[name], width: 1.5 },
          name: `corner ${name}: c=${fmt(c.c)}, λ=${fmt(c.lam)}, γ=${fmt(c.gamma)}` });
      }
    }
    const cur = last.curve;
    if (cur) {
      cell("v-error_at_alpha", cur.error_at_alpha);
      traces.push({ uid: "current", type: "scatter", mode: "lines", x: cur.alphas, y: cur.error, line: { color: "#111", width: 3 },
        name: "current knobs" });
      const bad = cur.alphas.map((a, i) => (cur.converged[i] ? null : i)).filter((i) => i !== null);
      if (bad.length) {
        traces.push({ uid: "unconverged", type: "scatter", mode: "markers", x: bad.map((i) => cur.alphas[i]), y: bad.map((i) => cur.error[i]),
          marker: { symbol: "x", size: 9, color: "#c44e52" }, name: "no converged solution" });
      }
      if (cur.error_at_alpha !== null) {
        traces.push({ uid: "at-alpha", type: "scatter", mode: "markers", x: [cur.alpha], y: [cur.error_at_alpha],
          marker: { size: 10, color: "#111" }, name: `α = ${fmt(cur.alpha)}: E_g = ${fmt(cur.error_at_alpha)}` });
      }
    }
    const sim = last.sim;
    if (sim && sim.results.length) {
      const fresh = sameKnobs(sim.knobs);
      const rs = sim.results;
      traces.push({ uid: "sim-runs", type: "scatter", mode: "markers", x: rs.map((r) => r.alpha), y: rs.map((r) => r.error),
        marker: { size: 5, color: fresh ? "#7b3294" : "#bbb" }, opacity: fresh ? 0.6 : 0.5,
        name: `simulated, ${sim.params.method}, D = ${sim.params.dim}${fresh ? "" : " (earlier knobs)"}` });
      const by = new Map();
      for (const r of rs) by.set(r.alpha, [...(by.get(r.alpha) || []), r.error]);
      const xs = [...by.keys()].sort((a, b) => a - b);
      traces.push({ uid: "sim-mean", type: "scatter", mode: "markers", x: xs, y: xs.map((a) => by.get(a).reduce((s, v) => s + v, 0) / by.get(a).length),
        marker: { size: 11, symbol: "circle-open", color: fresh ? "#7b3294" : "#bbb", line: { width: 2 } }, name: "simulated, mean over seeds" });
    }
    const adv = last.advice;
    if (adv && adv.error !== null) {
      traces.push({ uid: "advice", type: "scatter", mode: "markers", x: [adv.alpha], y: [adv.error],
        marker: { size: 15, symbol: "star", color: colors[adv.regime] || "#111", line: { width: 1, color: "#111" } },
        name: `advisor's best: c=${fmt(adv.c)}, λ=${fmt(adv.lam)}, γ=${fmt(adv.gamma)}` });
    }
    const layout = { title: { text: "Replica learning curve E_g(α), against the regime corners", font: { size: 13 } }, font: FONT,
      xaxis: { title: axisTitle("α = N_FT / D"), range: [0, Math.max(1, cur ? cur.alpha * 1.05 : 1)] },
      yaxis: { title: axisTitle("E_g (per-coordinate MSE)"), rangemode: "tozero" },
      legend: { x: 0.99, xanchor: "right", y: 0.99, bgcolor: "rgba(255,255,255,0.7)", font: { size: 10 } },
      margin: { l: 55, r: 10, t: 32, b: 40 } };
    return Plotly.react("curve", traces, layout, CONFIG);
  }

  // ---- jobs: the advisor and the simulations run in the server's job process; the page polls ---------------
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const jobs = { advise: null, simulate: null };

  async function startJob(kind, extra) {
    const params = new URLSearchParams({ ...state, ...extra });
    const res = await fetch(`/api/${kind}?${params}`, { method: "POST" });
    const body = await res.json();
    if (!res.ok) { setMessage(kind, body.error, "error"); return null; }
    setMessage(kind, null);
    jobs[kind] = body.job;
    return body.job;
  }

  async function poll(kind, id, onStatus) {
    for (;;) {
      if (jobs[kind] !== id) return;
      let st;
      try {
        const res = await fetch(`/api/job?id=${encodeURIComponent(id)}`);
        st = await res.json();
        if (!res.ok) { setMessage(kind, st.error, "error"); return; }
      } catch (err) { setMessage(kind, `no answer from the local server (${err.message})`, "error"); return; }
      await onStatus(st);
      if (st.state !== "running") {
        if (st.state === "error") setMessage(kind, st.error, "error");
        return;
      }
      await sleep(250);
    }
  }

  async function advise() {
    $("advise").disabled = true;
    $("advise-status").textContent = "advising…";
    const id = await startJob("advise", {});
    if (id) {
      await poll("advise", id, async (st) => {
        $("advise-status").textContent = st.state === "running" ? `advising… ${st.elapsed.toFixed(1)} s` :
          st.state === "done" ? `done in ${st.elapsed.toFixed(1)} s for ρ_PT=${st.knobs.rho_pt}, ρ_FT=${st.knobs.rho_ft}, ω=${st.knobs.overlap}, α=${st.knobs.alpha}` : st.state;
        if (st.state === "done") {
          const a = st.results[0];
          last.advice = a;
          for (const key of ["c", "lam", "gamma", "error"]) cell(`a-${key}`, a[key]);
          cell("a-regime", a.regime);
          $("a-corners").textContent = ORDER.map((n) => `${n}: ${fmt(a.corners[n])}`).join(", ");
          $("advice").hidden = false;
          await drawCurve();
        }
      });
    } else {
      $("advise-status").textContent = "";
    }
    $("advise").disabled = false;
  }

  function useAdvice() {
    const a = last.advice;
    if (!a) return;
    for (const name of ["c", "lam", "gamma"]) {
      showKnob(name, String(a[name]));
      setKnob(name, String(a[name]));
    }
  }

  function drawSimStatus() {
    const sim = last.sim;
    if (!sim) return;
    const fresh = sameKnobs(sim.knobs);
    $("sim-progress").max = sim.total;
    $("sim-progress").value = sim.done;
    $("sim-status").textContent = `${sim.done} / ${sim.total} runs, ${sim.state}, ${sim.elapsed.toFixed(1)} s` +
      (fresh ? "" : " (for earlier knobs)");
  }

  async function simulate() {
    $("sim-run").disabled = true;
    const id = await startJob("simulate", { dim: $("sim-dim").value, seeds: $("sim-seeds").value,
      method: $("sim-method").value, sim_alphas: $("sim-alphas").value });
    $("sim-run").disabled = false;
    if (!id) return;
    $("sim-cancel").disabled = false;
    await poll("simulate", id, async (st) => {
      last.sim = st;
      drawSimStatus();
      await drawCurve();
    });
    if (jobs.simulate === id) $("sim-cancel").disabled = true;
  }

  async function cancelSim() {
    if (!jobs.simulate) return;
    await fetch(`/api/cancel?id=${encodeURIComponent(jobs.simulate)}`, { method: "POST" });
  }

  // ---- start -------------------------------------------------------------------------------------------------
  async function start() {
    meta = await (await fetch("/api/knobs")).json();
    buildKnobs();
    buildOverlays();
    const fromHash = new URLSearchParams(location.hash.slice(1));
    for (const k of KNOBS) {
      const text = fromHash.has(k.name) ? fromHash.get(k.name) : String(meta.defaults[k.name]);
      state[k.name] = text;
      showKnob(k.name, text);
    }
    for (const m of meta.sim_methods) $("sim-method").add(new Option(m === "flow" ? "gradient flow (exact)" : "gradient descent", m));
    $("sim-method").value = meta.simulation.method;
    $("sim-dim").value = meta.simulation.dim;
    $("sim-seeds").value = meta.simulation.seeds;
    $("sim-alphas").value = meta.simulation.sim_alphas;
    $("advise").addEventListener("click", advise);
    $("advice-use").addEventListener("click", useAdvice);
    $("sim-run").addEventListener("click", simulate);
    $("sim-cancel").addEventListener("click", cancelSim);
    for (const kind of ["point", "corners", "curve"]) schedule(kind);
  }

  // For the browser tests and the timing script: the knobs sent, the last answers drawn, the timings.
  window.ftlab = {
    state, last, timings, messages,
    idle: () => meta !== null && ["point", "curve", "corners"].every((k) => !busy[k] && !dirty[k]),
  };
  start();
})();
