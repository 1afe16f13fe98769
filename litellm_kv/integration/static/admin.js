// The litellm-kv admin page. Everything shown comes from the proxy's admin-only routes, called with the
// admin's own credentials; every value is written with textContent (never as HTML).
"use strict";

const KEY_STORE = "litellm_kv_admin_key";
const PERIODS = { day: "day", week: "week", month: "month" };
const TOKENS = { reasoning_tokens: "reasoning", visual_tokens: "visual" };

let credential = null; // { key, header, source }
let current = null; // the owner view shown

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k in node && typeof v !== "string") node[k] = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

// -- credentials --------------------------------------------------------------------------------------
// LiteLLM's admin UI keeps its session in the `token` cookie (a JWT the dashboard itself decodes to get
// the key it sends); the signature is checked by the proxy on every call, not here.
function sessionFromCookie() {
  const m = document.cookie.match(/(?:^|;\s*)token=([^;]+)/);
  if (!m) return null;
  try {
    const part = m[1].split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const claims = JSON.parse(atob(part + "=".repeat((4 - (part.length % 4)) % 4)));
    if (!claims.key) return null;
    return { key: claims.key, header: claims.auth_header_name || "Authorization", source: "LiteLLM admin UI session" };
  } catch (e) {
    return null;
  }
}

function storedCredential() {
  const key = sessionStorage.getItem(KEY_STORE);
  return key ? { key, header: "Authorization", source: "admin key" } : null;
}

async function call(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  headers[credential.header] = "Bearer " + credential.key;
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, {
    method: options.method || "GET",
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
    credentials: "same-origin",
  });
  let data = null;
  try { data = await resp.json(); } catch (e) { data = null; }
  return { ok: resp.ok, status: resp.status, data };
}

function errorText(res) {
  const d = res.data || {};
  const detail = d.detail !== undefined ? d.detail : d.error;
  if (typeof detail === "string") return detail;
  if (detail && typeof detail.message === "string") return detail.message;
  if (detail && typeof detail.error === "string") return detail.error;
  if (typeof d.message === "string") return d.message;
  return "HTTP " + res.status;
}

async function signIn(cred, remember) {
  credential = cred;
  const res = await call("admin/fleet");
  if (!res.ok) {
    credential = null;
    if (remember) sessionStorage.removeItem(KEY_STORE);
    const why = res.status === 403 ? "this key is not a proxy admin"
      : res.status === 401 ? "the proxy refused this key (" + errorText(res) + ")" : errorText(res);
    showSignIn("Not signed in: " + why + ".");
    return false;
  }
  if (remember) sessionStorage.setItem(KEY_STORE, cred.key);
  $("signin").hidden = true;
  $("app").hidden = false;
  $("signout").hidden = cred.source !== "admin key";
  $("whoami").textContent = "signed in with " + cred.source;
  renderFleet(res.data);
  return true;
}

function showSignIn(message) {
  $("app").hidden = true;
  $("signin").hidden = false;
  $("signout").hidden = true;
  $("whoami").textContent = "";
  $("signin-error").textContent = message || "";
}

// -- key or team --------------------------------------------------------------------------------------
function ownerQuery(kind, id) {
  return "admin/owner?" + new URLSearchParams(kind === "team" ? { team_id: id } : { key: id }).toString();
}

async function lookUp(kind, id) {
  const msg = $("owner-message");
  msg.hidden = true;
  if (!id) return;
  $("owner").hidden = true; // shown again with the answer, never with another owner's data
  const res = await call(ownerQuery(kind, id));
  if (!res.ok) {
    $("owner").hidden = true;
    msg.hidden = false;
    msg.className = res.status === 503 ? "notice warn" : "notice error";
    msg.textContent = res.status === 503 && res.data && res.data.error === "no_database"
      ? "No database: " + res.data.message : errorText(res);
    return;
  }
  current = res.data;
  location.hash = new URLSearchParams({ [kind]: id }).toString();
  renderOwner(current);
}

function fieldKey(section, name) { return section + "." + name; }

function renderOwner(v) {
  $("owner").hidden = false;
  $("owner-title").textContent = v.label;
  const sub = [v.kind === "key" ? "Key ID " + v.id : "team_id " + v.id];
  if (v.team) sub.push("member of " + v.team.label);
  $("owner-sub").textContent = sub.join(" · ");

  const list = $("stored-error-list");
  list.replaceChildren(...v.errors.map((e) => el("li", {}, e.message)));
  $("stored-errors").hidden = v.errors.length === 0;

  const sections = $("sections");
  sections.replaceChildren();
  for (const [section, fields] of Object.entries(v.fields)) {
    const own = (v.litellm_kv && typeof v.litellm_kv[section] === "object" && v.litellm_kv[section]) || {};
    const teamOwn = (v.team && v.team.litellm_kv && typeof v.team.litellm_kv[section] === "object"
      && v.team.litellm_kv[section]) || {};
    const groups = v.applies_to[section] || [];
    const fs = el("fieldset", { class: "section", dataset: { section } },
      el("legend", {}, section === "reasoning" ? "Reasoning" : "Vision"),
      el("p", { class: "muted small" }, !v.enabled[section] ? "Not enabled on this proxy."
        : groups.length ? "Applies in model groups: " + groups.join(", ")
          : "No model group has " + section + " limits in the config: these settings apply nowhere yet."));
    for (const f of fields) {
      const id = "f-" + section + "-" + f.name;
      const value = own[f.name];
      let input;
      if (f.kind === "boolean" || f.kind === "choice") {
        const options = f.kind === "boolean" ? ["true", "false"] : f.choices;
        input = el("select", { id, name: fieldKey(section, f.name) },
          el("option", { value: "" }, "(not set)"), ...options.map((o) => el("option", { value: o }, o)));
        input.value = value === undefined || value === null ? "" : String(value);
      } else {
        input = el("input", { id, name: fieldKey(section, f.name), inputmode: "numeric", autocomplete: "off",
          value: value === undefined || value === null ? "" : (typeof value === "object" ? JSON.stringify(value) : String(value)) });
      }
      input.dataset.kind = f.kind;
      const teamValue = teamOwn[f.name];
      fs.append(el("div", { class: "field" },
        el("label", { for: id, title: f.description || "" }, f.name),
        input,
        el("span", { class: "hint" }, teamValue !== undefined && teamValue !== null ? "team: " + JSON.stringify(teamValue) : ""),
        el("span", { class: "field-error", role: "alert", dataset: { errorFor: fieldKey(section, f.name) } })));
    }
    sections.append(fs);
  }
  $("save-status").textContent = "";
  $("save-status").className = "";

  const body = $("usage").tBodies[0];
  body.replaceChildren(...v.usage.map((u) => {
    const used = u.used === undefined ? null : u.used;
    const pct = used === null || !u.limit ? 0 : Math.min(100, Math.round((100 * (used + (u.held || 0))) / u.limit));
    const bar = el("div", { class: "bar" + (pct >= 100 ? " full" : pct >= 80 ? " high" : "") });
    bar.style.width = pct + "%";
    return el("tr", {},
      el("td", {}, TOKENS[u.meter] || u.meter),
      el("td", {}, PERIODS[u.period] || u.period),
      el("td", {}, u.scope_label),
      el("td", { class: "num" }, used === null ? "—" : used.toLocaleString("en")),
      el("td", { class: "num" }, u.held === undefined ? "—" : u.held.toLocaleString("en")),
      el("td", { class: "num" }, u.limit.toLocaleString("en")),
      el("td", { class: "meter" }, u.error ? el("span", { class: "error" }, u.error) : el("div", { class: "track" }, bar)),
      el("td", {}, u.source),
      el("td", {}, u.reset_at.replace("T", " ").replace("+00:00", "")));
  }));
  $("usage-empty").hidden = v.usage.length > 0;

  $("refusals-scope").textContent = "Refused by " + v.refusals_scope + ", newest first.";
  const rb = $("refusals").tBodies[0];
  rb.replaceChildren(...v.refusals.map((r) => el("tr", {},
    el("td", {}, new Date(r.at * 1000).toISOString().replace("T", " ").slice(0, 19)),
    el("td", {}, r.model),
    el("td", {}, r.limit),
    el("td", { class: "num" }, r.status),
    el("td", { class: "message" }, r.message))));
  $("refusals-empty").hidden = v.refusals.length > 0;
}

// The form's values as a litellm_kv object: empty fields are left out, integers typed as digits become
// numbers, anything else is sent as typed (the check names the field).
function formObject() {
  const out = {};
  for (const input of $("limits").querySelectorAll("input, select")) {
    const [section, name] = input.name.split(".");
    const raw = input.value.trim();
    if (raw === "") continue;
    let value = raw;
    if (input.dataset.kind === "boolean") value = raw === "true";
    else if (input.dataset.kind === "integer" && /^-?\d+$/.test(raw)) value = Number(raw);
    (out[section] = out[section] || {})[name] = value;
  }
  return out;
}

function showFieldErrors(errors) {
  for (const span of document.querySelectorAll(".field-error")) span.textContent = "";
  for (const input of $("limits").querySelectorAll(".invalid")) input.classList.remove("invalid");
  const unplaced = [];
  for (const e of errors) {
    const parts = String(e.field || "").split(".");
    const name = parts.slice(-2).join(".");
    const span = document.querySelector('.field-error[data-error-for="' + CSS.escape(name) + '"]');
    if (span) {
      span.textContent = e.message;
      const input = $("limits").querySelector('[name="' + CSS.escape(name) + '"]');
      if (input) input.classList.add("invalid");
    } else {
      unplaced.push(e.message);
    }
  }
  return unplaced;
}

function setStatus(text, cls) {
  $("save-status").textContent = text;
  $("save-status").className = cls || "";
}

function parsedMetadata(md) {
  if (md === null || md === undefined || md === "") return {};
  if (typeof md === "string") {
    try { return JSON.parse(md); } catch (e) { return null; }
  }
  return md;
}

async function save(event) {
  event.preventDefault();
  if (!current) return;
  const kv = formObject();
  setStatus("Checking…");
  const check = await call("admin/check", { method: "POST", body: { kind: current.kind, id: current.id, label: current.label, litellm_kv: kv } });
  if (!check.ok) { setStatus("Not saved: " + errorText(check), "error"); return; }
  const unplaced = showFieldErrors(check.data.errors);
  if (check.data.errors.length) {
    setStatus("Not saved: " + check.data.errors.length + " field(s) need fixing." + (unplaced.length ? " " + unplaced.join(" ") : ""), "error");
    return;
  }
  // Read, merge, write: LiteLLM replaces the whole metadata, so everything else in it is sent back as it is.
  setStatus("Saving…");
  const isKey = current.kind === "key";
  const info = await call(isKey ? "../key/info?" + new URLSearchParams({ key: current.id })
    : "../team/info?" + new URLSearchParams({ team_id: current.id }));
  if (!info.ok) { setStatus("Not saved: could not read the current metadata: " + errorText(info), "error"); return; }
  const stored = parsedMetadata(isKey ? (info.data.info || {}).metadata : (info.data.team_info || {}).metadata);
  if (stored === null || typeof stored !== "object" || Array.isArray(stored)) {
    setStatus("Not saved: the stored metadata is not a JSON object; fix it in LiteLLM's editor first.", "error");
    return;
  }
  const metadata = Object.assign({}, stored);
  if (Object.keys(kv).length) metadata[current.metadata_key] = kv; else delete metadata[current.metadata_key];
  const update = await call(isKey ? "../key/update" : "../team/update", {
    method: "POST", body: isKey ? { key: current.id, metadata } : { team_id: current.id, metadata } });
  if (!update.ok) {
    const text = errorText(update);
    const named = check.data.errors.length ? [] : showFieldErrors(fieldsIn(text));
    setStatus("Not saved: " + (named.length ? named.join(" ") : text), "error");
    return;
  }
  const kind = current.kind, id = current.id;
  await lookUp(kind, id);
  setStatus("Saved. This proxy process applies it from the next request; other workers and proxies at once with "
    + "general_settings.coordination_redis, else within user_api_key_cache_ttl (60 s).", "ok");
}

// A save-time refusal from LiteLLM names the field in its message: put it beside that field.
function fieldsIn(text) {
  const m = String(text).match(/metadata\.[A-Za-z0-9_]+\.(reasoning|vision)\.([A-Za-z0-9_]+)/);
  return m ? [{ field: m[0], message: text }] : [{ field: "", message: text }];
}

// -- fleet --------------------------------------------------------------------------------------------
function pct(x) { return x === null || x === undefined ? "—" : (100 * x).toFixed(1) + "%"; }
function num(x) { return x === null || x === undefined ? "—" : Math.round(x).toLocaleString("en"); }
function pairs(obj) {
  const entries = Object.entries(obj || {});
  return entries.length ? entries.map(([k, v]) => k + " " + num(v)).join(", ") : "none";
}

// How far the cost model's predicted TTFT was from the measured one (none with the block cost or before a
// streamed response).
function ttftError(e) {
  if (!e || !e.recent) return ["no streamed response yet"];
  const signed = e.signed_error_ms_p50;
  return ["median " + e.abs_error_ms.p50 + " ms, p90 " + e.abs_error_ms.p90 + " ms",
    el("span", { class: "muted small" }, " (|measured − predicted|, last " + num(e.recent) + " streamed responses; "
      + "signed median " + (signed > 0 ? "+" : "") + signed + " ms)")];
}

function renderFleet(f) {
  $("fleet-meta").textContent = "As seen by " + f.process + (f.mode ? " · mode " + f.mode : "")
    + (f.hashing ? " · hashing " + f.hashing : "") + " · " + new Date(f.at * 1000).toISOString().slice(11, 19) + " UTC";
  const w = f.workers || {};
  const perWorker = Object.values(w.per_worker || {});
  const warn = $("fleet-workers");
  warn.hidden = perWorker.length === 0;
  warn.replaceChildren(...(perWorker.length ? [el("strong", {}, w.count + " worker processes (" + w.from + "): "),
    "each keeps for itself what follows.", el("ul", {}, ...perWorker.map((t) => el("li", {}, t)))] : []));
  const evicting = (f.redis_eviction || []).filter((r) => r.may_evict.length);
  const ev = $("fleet-eviction");
  ev.hidden = evicting.length === 0;
  ev.className = "notice " + (evicting.some((r) => Object.keys(r.problems).length) ? "error" : "warn");
  ev.replaceChildren(...evicting.map((r) => el("p", {},
    el("strong", {}, "Redis " + r.redis + ": "),
    "maxmemory-policy " + r.policy + " with maxmemory " + num(r.maxmemory) + " bytes, " + num(r.evicted_keys)
      + " keys evicted so far; once full it deletes keys of " + r.may_evict.join(", ") + ".",
    ...Object.entries(r.problems).map(([use, why]) => el("span", { class: "block" }, use + ": " + why)))));
  const box = $("fleet-groups");
  box.replaceChildren();
  const groups = Object.entries(f.groups || {});
  $("fleet-empty").hidden = groups.length > 0;
  for (const [name, g] of groups) {
    const badge = el("span", { class: "badge " + (g.exact ? "ok" : "bad") }, g.exact ? "exact" : "not exact: " + (g.not_exact_why || "?"));
    const stats = el("dl", { class: "stats" },
      el("dt", {}, "Prediction accuracy"), el("dd", { dataset: { stat: "accuracy" } }, pct(g.prediction_accuracy),
        el("span", { class: "muted small" }, " (" + pairs(g.prediction_checks) + ")")),
      el("dt", {}, "Cache hit rate"), el("dd", { dataset: { stat: "hit_rate" } }, pct(g.hit_rate),
        el("span", { class: "muted small" }, " (" + num(g.actual_cached_tokens) + " of " + num(g.prompt_tokens) + " prompt tokens)")),
      el("dt", {}, "Predicted hit rate"), el("dd", { dataset: { stat: "predicted_hit_rate" } }, pct(g.predicted_hit_rate)),
      el("dt", {}, "TTFT prediction error"), el("dd", { dataset: { stat: "ttft_error" } }, ...ttftError(g.ttft_error)),
      el("dt", {}, "Routing decisions"), el("dd", { dataset: { stat: "decisions" } }, pairs(g.decisions)),
      el("dt", {}, "Load-only fallbacks"), el("dd", { dataset: { stat: "fallbacks" } }, pairs(g.fallbacks)));
    const rows = (g.replicas || []).map((r) => {
      const ranks = (r.subscriber && r.subscriber.ranks) || [];
      const connected = ranks.filter((k) => k.connected).length;
      const events = !ranks.length ? (f.mode === "shared" ? "via indexer" : "—")
        : (connected === ranks.length ? "connected" : connected + " of " + ranks.length + " connected")
          + " · " + (ranks.every((k) => k.last_seq < 0) ? "no batch yet" : "seq " + ranks.map((k) => k.last_seq).join(", ")) + (ranks.some((k) => k.gaps) ? " · gaps " + ranks.reduce((a, k) => a + k.gaps, 0) : "");
      return el("tr", {},
        el("td", {}, r.replica),
        el("td", {}, el("span", { class: "badge " + (r.ready ? "ok" : "bad") }, r.ready ? "ready" : "not ready")),
        el("td", { class: "num" }, r.block_size === null ? "—" : r.block_size),
        el("td", {}, r.hash_algo || "—"),
        el("td", { class: "num" }, num(r.running) + " / " + num(r.waiting)),
        el("td", { class: "num" }, r.kv_usage === null || r.kv_usage === undefined ? "—" : pct(r.kv_usage)),
        el("td", {}, events),
        el("td", { class: "message" }, r.not_exact || r.error || ""));
    });
    const table = el("table", { class: "replicas" },
      el("thead", {}, el("tr", {}, ...["Replica", "State", "Block", "Hash", "Running / waiting", "KV cache used", "Events", "Problem"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...rows));
    box.append(el("div", { class: "group", dataset: { group: name } },
      el("h3", {}, name + " ", badge, el("span", { class: "muted small" }, " " + (g.mode || ""))), stats, table));
  }
  const ab = $("affinity").tBodies[0];
  const aff = Object.entries(f.affinity || {});
  ab.replaceChildren(...(aff.length ? aff.map(([n, a]) => el("tr", {}, el("td", {}, n), el("td", { class: "num" }, num(a.hits)),
    el("td", {}, pairs(a.misses)), el("td", { class: "num" }, pct(a.hit_rate))))
    : [el("tr", {}, el("td", { colspan: "4", class: "muted" }, "No affinity-routed requests yet."))]));
  const rc = $("refusal-counts").tBodies[0];
  rc.replaceChildren(...(f.refusals.length ? f.refusals.map((r) => el("tr", {}, el("td", {}, r.limit), el("td", { class: "num" }, r.status),
    el("td", { class: "num" }, num(r.count))))
    : [el("tr", {}, el("td", { colspan: "3", class: "muted" }, "No request refused yet."))]));
  const rd = $("redis").tBodies[0];
  rd.replaceChildren(...(f.redis.length ? f.redis.map((r) => el("tr", {}, el("td", {}, r.use), el("td", {}, r.scope),
    el("td", {}, el("span", { class: "badge " + (r.state === "closed" ? "ok" : "bad") }, r.state))))
    : [el("tr", {}, el("td", { colspan: "3", class: "muted" }, "No Redis store in use (embedded mode)."))]));
}

async function refreshFleet() {
  const res = await call("admin/fleet");
  if (res.ok) renderFleet(res.data);
  else $("fleet-meta").textContent = "Could not read the fleet: " + errorText(res);
}

function showTab(name) {
  $("tab-owner").setAttribute("aria-selected", String(name === "owner"));
  $("tab-fleet").setAttribute("aria-selected", String(name === "fleet"));
  $("owner-panel").hidden = name !== "owner";
  $("fleet-panel").hidden = name !== "fleet";
  if (name === "fleet") refreshFleet();
}

// -- start ----------------------------------------------------------------------------------------------
document.addEventListener("DOMContentLoaded", async () => {
  $("signin-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const key = $("admin-key").value.trim();
    if (key) await signIn({ key, header: "Authorization", source: "admin key" }, true);
  });
  $("signout").addEventListener("click", () => { sessionStorage.removeItem(KEY_STORE); credential = null; showSignIn(""); });
  $("lookup").addEventListener("submit", (e) => { e.preventDefault(); lookUp($("lookup-kind").value, $("lookup-id").value.trim()); });
  $("limits").addEventListener("submit", save);
  $("tab-owner").addEventListener("click", () => showTab("owner"));
  $("tab-fleet").addEventListener("click", () => showTab("fleet"));
  $("fleet-refresh").addEventListener("click", refreshFleet);

  const cred = storedCredential() || sessionFromCookie();
  if (!cred || !(await signIn(cred, cred.source === "admin key"))) {
    if (!cred) showSignIn("");
    return;
  }
  const wanted = new URLSearchParams(location.hash.slice(1));
  for (const kind of ["key", "team"]) {
    if (wanted.get(kind)) {
      $("lookup-kind").value = kind;
      $("lookup-id").value = wanted.get(kind);
      await lookUp(kind, wanted.get(kind));
    }
  }
});
