// hookq console: a small single-page app over the /v1 API. Every value
// from the API is put into the page with textContent (never innerHTML), so
// a job's body, URL or error shows as text whatever it holds. The key lives
// in this tab's sessionStorage and goes out as a bearer header only.
'use strict';

const KEY_STORE = 'hookq.key';
const STATES = ['scheduled', 'ready', 'inflight', 'delivered', 'dead', 'cancelled'];
// `tenant`: the tenant the key is bound to (null: any tenant).
const session = { scopes: [], open: false, key: null, tenant: null };
let pageTimer = null;

// ---- DOM helpers -------------------------------------------------------

/** An element with attributes (class, href, data-*, ...) and children
 *  (strings become text nodes). */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === 'onclick' || name === 'onsubmit' || name === 'onchange') {
      node.addEventListener(name.slice(2), value);
    } else if (name === 'text') {
      node.textContent = value;
    } else {
      node.setAttribute(name, value === true ? '' : String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function table(headers, rows, empty) {
  if (rows.length === 0) return el('p', { class: 'muted' }, empty || 'Nothing here.');
  return el('table', {},
    el('thead', {}, el('tr', {}, headers.map((h) => el('th', {}, h)))),
    el('tbody', {}, rows.map((cells) => el('tr', {}, cells.map((c) => el('td', {}, c))))));
}

function show(...nodes) {
  const main = document.getElementById('main');
  main.replaceChildren(...nodes.flat().filter((n) => n !== null && n !== undefined && n !== false));
}

/** Shows `nodes` if the page is still at `hash`: an answer that comes
 *  after the operator moved on does not replace the page shown since. */
function showAt(hash, ...nodes) {
  if (location.hash === hash) show(...nodes);
}

function banner(text, kind) {
  const node = document.getElementById('banner');
  if (!text) {
    node.hidden = true;
    node.textContent = '';
    return;
  }
  node.hidden = false;
  node.className = kind || 'error';
  node.textContent = text;
}

function can(scope) {
  return session.scopes.includes(scope);
}

function fmtTime(text) {
  return text ? text.replace('T', ' ').replace('Z', ' UTC') : '–';
}

// ---- Tenants -----------------------------------------------------------
// A list page's tenant filter lives in the URL (`#/jobs?tenant=billing`);
// a page of one item names its tenant the same way (`#/job/42?tenant=orders`)
// and every call about the item sends it. A key bound to a tenant sees only
// that tenant: the URL's `tenant` is ignored and the filter is fixed.

/** The tenant a list page shows: a bound key's own, else the URL's
 *  `tenant` (empty: every tenant). */
function pageTenant(params) {
  return session.tenant || (params && params.get('tenant')) || '';
}

/** The tenant a page of one item acts in: the bound key's, the URL's, or
 *  `default` (as the API takes it). */
function itemTenant(params) {
  return pageTenant(params) || 'default';
}

/** `?tenant=NAME`, for API paths and links. */
function tq(tenant) {
  return '?tenant=' + encodeURIComponent(tenant);
}

/** A list page's hash with its tenant filter (none: every tenant). */
function listHash(page, tenant, params) {
  const query = new URLSearchParams();
  if (tenant && !session.tenant) query.set('tenant', tenant);
  for (const [name, value] of params || []) if (value) query.set(name, value);
  return `#/${page}` + (query.toString() ? '?' + query : '');
}

/** A link to job `id` of `tenant`. */
function jobLink(id, tenant) {
  return el('a', { href: '#/job/' + encodeURIComponent(id) + tq(tenant) }, id);
}

/** A link to schedule `id` of `tenant`. */
function scheduleLink(id, tenant) {
  return el('a', { href: '#/schedule/' + encodeURIComponent(id) + tq(tenant) }, id);
}

/** The tenant filter: a bound key's tenant, fixed; else a select of every
 *  tenant (from `GET /v1/tenants`) whose choice calls `changed`. */
function tenantFilter(current, changed) {
  if (session.tenant) {
    return el('select', { name: 'tenant', id: 'tenant', disabled: true, title: 'This key acts in its tenant alone' },
      el('option', { value: session.tenant, selected: true }, 'tenant ' + session.tenant));
  }
  const option = (name) => el('option', { value: name, selected: name === current }, name);
  const select = el('select', { name: 'tenant', id: 'tenant', onchange: () => changed(select.value) },
    el('option', { value: '' }, 'every tenant'), current ? option(current) : null);
  attempt(async () => {
    const page = await api('GET', '/v1/tenants');
    const chosen = select.value;
    const names = new Set(page.tenants.map((t) => t.tenant));
    if (chosen) names.add(chosen);
    select.replaceChildren(el('option', { value: '' }, 'every tenant'), ...[...names].sort().map(option));
    select.value = chosen;
  });
  return select;
}

// ---- API ---------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.code = error.code || 'http_' + status;
    this.field = error.field || null;
  }
}

/** Calls the API; a 401 asks for a key again, Redis being down shows a
 *  banner; any other error is thrown as an ApiError. */
async function api(method, path, body) {
  const headers = { Accept: 'application/json' };
  if (session.key) headers.Authorization = 'Bearer ' + session.key;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: 'omit',
      cache: 'no-store',
    });
  } catch (e) {
    banner('The hookq daemon does not answer: ' + e.message);
    throw e;
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch (e) {
    data = null;
  }
  if (response.status === 401) {
    sessionStorage.removeItem(KEY_STORE);
    session.key = null;
    login('This key is not known to the daemon (401). Enter a valid key.');
    throw new ApiError(401, data);
  }
  if (response.status === 503 && data && data.error && String(data.error.code).startsWith('redis')) {
    const reason = String(data.error.message).replace(/[.\s]*$/, '.');
    banner(`Redis is down: ${reason} The figures below may be stale.`);
    throw new ApiError(503, data);
  }
  if (!response.ok) throw new ApiError(response.status, data);
  banner(null);
  return data;
}

/** Runs an action, showing its failure (403 names the missing scope). */
async function attempt(action, done) {
  try {
    const result = await action();
    if (done) done(result);
  } catch (e) {
    if (e.status === 403) banner('Refused (403): ' + e.message, 'error');
    else if (e.status !== 401 && e.status !== 503) banner(e.message + (e.field ? ` (${e.field})` : ''), 'error');
  }
}

// ---- Session -----------------------------------------------------------

function login(message) {
  stopTimer();
  document.getElementById('who').textContent = '';
  document.getElementById('logout').hidden = true;
  const input = el('input', { type: 'password', id: 'key', autocomplete: 'off', placeholder: 'API key (bearer token)', size: 50 });
  const form = el('form', {
    id: 'login',
    onsubmit: async (event) => {
      event.preventDefault();
      session.key = input.value.trim();
      sessionStorage.setItem(KEY_STORE, session.key);
      await start();
    },
  },
  el('h1', {}, 'hookq console'),
  el('p', {}, 'Enter an API key. It is kept in this browser tab only, until the tab closes.'),
  message ? el('p', { class: 'error', id: 'login-error' }, message) : null,
  input, ' ', el('button', { type: 'submit' }, 'Open'));
  show(form);
  input.focus();
}

async function start() {
  session.key = sessionStorage.getItem(KEY_STORE);
  let who;
  try {
    who = await api('GET', '/v1/whoami');
  } catch (e) {
    if (e.status === undefined || e.status === 503) {
      show(el('p', { class: 'error' }, 'Cannot reach the API: ' + e.message));
    }
    return;
  }
  session.scopes = who.scopes;
  session.open = who.open;
  session.tenant = who.tenant || null;
  const bound = session.tenant ? ` (tenant ${session.tenant} only)` : '';
  const label = who.open ? 'no key needed' : `key ${who.key}${bound}: ${who.scopes.join(', ')}`;
  document.getElementById('who').textContent = label;
  document.getElementById('logout').hidden = who.open;
  route();
}

// ---- Pages -------------------------------------------------------------

/** Marks the moment a page first shows its data (the benchmark reads it:
 *  milliseconds since the navigation started). */
function painted() {
  if (!document.body.dataset.painted) document.body.dataset.painted = String(Math.round(performance.now()));
}

function stopTimer() {
  if (pageTimer) clearInterval(pageTimer);
  pageTimer = null;
}

function every(ms, fn) {
  stopTimer();
  fn();
  pageTimer = setInterval(fn, ms);
}

function route() {
  stopTimer();
  banner(null);
  const hash = location.hash.replace(/^#\/?/, '') || 'overview';
  // `jobs?state=ready`: the page's name comes before its query.
  const [path, query = ''] = hash.split(/\?(.*)/s);
  const [page, ...rest] = path.split('/');
  const params = new URLSearchParams(query);
  const listed = ['overview', 'jobs', 'dead', 'schedules'];
  for (const a of document.querySelectorAll('#nav a')) {
    a.classList.toggle('active', a.dataset.page === page || (page === 'job' && a.dataset.page === 'jobs')
      || (page === 'schedule' && a.dataset.page === 'schedules'));
    // A list page's tenant filter follows to the other list pages.
    if (listed.includes(page) && listed.includes(a.dataset.page)) {
      a.setAttribute('href', listHash(a.dataset.page, pageTenant(params)));
    }
  }
  if (!session.open && !session.key) return login();
  if (page === 'jobs') return jobsPage(params);
  if (page === 'job') return jobPage(decodeURIComponent(rest.join('/')), params);
  if (page === 'dead') return deadPage(params);
  if (page === 'hosts') return hostsPage();
  if (page === 'schedules') return schedulesPage(params);
  if (page === 'schedule') return schedulePage(decodeURIComponent(rest.join('/')), params);
  return overviewPage(params);
}

// Overview: counts by state, deliveries and failures per second as a live
// chart, the oldest ready job's lag, the partitions, and each tenant's
// ledger. With a tenant chosen (or a bound key) the counts are that
// tenant's ledger and the chart its deliveries.
function overviewPage(params) {
  const tenant = pageTenant(params);
  const filter = tenantFilter(tenant, (t) => { location.hash = listHash('overview', t); });
  const counts = el('div', { class: 'cards', id: 'counts' });
  const chart = el('div', { id: 'chart' });
  const lag = el('p', { id: 'lag' });
  const tenants = el('div', { id: 'tenants' });
  const parts = el('div', { id: 'partitions' });
  show(el('h1', {}, 'Overview'), el('div', { class: 'row' }, filter), counts,
    el('h2', {}, tenant ? `Delivered per second (tenant ${tenant})` : 'Delivered and failed per second'), chart, lag,
    el('h2', {}, 'Tenants'), tenants,
    tenant ? null : [el('h2', {}, 'Partitions'), parts]);
  const points = [];
  const lateness = [];
  let last = null;
  every(1000, () => attempt(async () => {
    lateness.push(await latenessBuckets(tenant));
    if (lateness.length > 6) lateness.shift();
    const stats = await api('GET', '/v1/stats' + (tenant ? tq(tenant) : ''));
    // With a tenant the answer is its ledger: no failures, no partitions.
    const ledger = stats.tenant !== undefined;
    const now = performance.now();
    if (last) {
      const secs = Math.max((now - last.at) / 1000, 0.001);
      points.push({
        delivered: Math.max(stats.delivered - last.delivered, 0) / secs,
        failed: ledger ? null : Math.max(stats.failed_attempts - last.failed, 0) / secs,
      });
      if (points.length > 120) points.shift();
    }
    last = { at: now, delivered: stats.delivered, failed: stats.failed_attempts };
    const shown = ledger
      ? ['live', 'created', 'replayed', 'delivered', 'dead_lettered', 'cancelled']
      : ['scheduled', 'ready', 'inflight', 'dead', 'delivered', 'cancelled', 'failed_attempts'];
    counts.replaceChildren(...shown
      .map((name) => el('div', { class: 'card', 'data-count': name },
        el('div', { class: 'figure' }, String(stats[name])), el('div', { class: 'label' }, name.replace('_', ' ')))));
    chart.replaceChildren(drawChart(points, !ledger));
    const [p50, p99] = [0.5, 0.99].map((q) => quantile(lateness[lateness.length - 1], lateness[0], q));
    const late = p50 === null
      ? 'no attempt started in the last 5 s'
      : `p50 ≤ ${p50}, p99 ≤ ${p99} over the last 5 s (this daemon)`;
    lag.textContent = ledger
      ? `Lateness of tenant ${stats.tenant}'s attempts (start − due): ${late} · weight ${stats.weight} · live jobs at most ${stats.max_live_jobs || 'unlimited'} · creates per second at most ${stats.create_rate || 'unlimited'}`
      : `Lateness (attempt start − due): ${late} · oldest ready job waiting: ${stats.oldest_ready_lag_ms} ms · held for a host: ${stats.held_for_host} · waiting behind their ordering key: ${stats.held_in_order} · leases expired: ${stats.expired_leases}`;
    tenants.replaceChildren(await tenantTable(tenant));
    if (!ledger) {
      parts.replaceChildren(table(['partition', 'scheduled', 'ready', 'in flight', 'dead', 'delivered'],
        (stats.partitions || []).map((p) => [p.partition, p.scheduled, p.ready, p.inflight, p.dead, p.delivered].map(String))));
    }
    painted();
  }));
}

/** Each tenant's ledger as a table (only `tenant` when one is chosen or
 *  the key is bound), each name linking to its jobs. */
async function tenantTable(tenant) {
  let rows;
  try {
    rows = tenant
      ? [await api('GET', '/v1/tenants/' + encodeURIComponent(tenant))]
      : (await api('GET', '/v1/tenants')).tenants;
  } catch (e) {
    // A tenant named in the URL that has never had a job.
    if (e.status !== 404) throw e;
    rows = [];
  }
  return table(['tenant', 'live', 'created', 'replayed', 'delivered', 'dead lettered', 'cancelled', 'weight'],
    rows.map((t) => [
      el('a', { href: listHash('jobs', t.tenant), 'data-tenant': t.tenant }, t.tenant),
      ...[t.live, t.created, t.replayed, t.delivered, t.dead_lettered, t.cancelled, t.weight].map(String),
    ]), tenant ? `Tenant ${tenant} has had no job yet.` : 'No tenant yet.');
}

/** The cumulative buckets of this daemon's `hookq_lateness_seconds`
 *  histogram from /metrics (upper bound → count), of `tenant` alone when
 *  one is given, or null. */
async function latenessBuckets(tenant) {
  try {
    const headers = session.key ? { Authorization: 'Bearer ' + session.key } : {};
    const response = await fetch('/metrics', { headers, credentials: 'omit', cache: 'no-store' });
    if (!response.ok) return null;
    const buckets = new Map();
    for (const line of (await response.text()).split('\n')) {
      const m = line.match(/^hookq_lateness_seconds_bucket\{([^}]*)\} (\S+)$/);
      if (!m) continue;
      const labels = Object.fromEntries([...m[1].matchAll(/(\w+)="([^"]*)"/g)].map((l) => [l[1], l[2]]));
      if (labels.le === undefined || (tenant && labels.tenant !== tenant)) continue;
      buckets.set(labels.le, (buckets.get(labels.le) || 0) + Number(m[2]));
    }
    return buckets.size ? buckets : null;
  } catch (e) {
    return null;
  }
}

/** The bucket bound under which a `q` share of the attempts between two
 *  readings fell, as text (`5 ms`), or null when none started. */
function quantile(now, before, q) {
  if (!now) return null;
  const count = (map, le) => (map ? map.get(le) || 0 : 0);
  const total = count(now, '+Inf') - count(before, '+Inf');
  if (total <= 0) return null;
  const bounds = [...now.keys()].filter((le) => le !== '+Inf').sort((a, b) => Number(a) - Number(b));
  for (const le of bounds) {
    if (count(now, le) - count(before, le) >= q * total) {
      const secs = Number(le);
      return secs < 1 ? `${+(secs * 1000).toFixed(1)} ms` : `${secs} s`;
    }
  }
  return 'more than ' + bounds[bounds.length - 1] + ' s';
}

/** An SVG line chart of delivered (and, with `failures`, failed) per
 *  second. */
function drawChart(points, failures) {
  const ns = 'http://www.w3.org/2000/svg';
  const width = 600;
  const height = 160;
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('viewBox', `0 0 ${width} ${height + 20}`);
  svg.setAttribute('class', 'chart');
  svg.setAttribute('data-points', String(points.length));
  const top = 1.25 * Math.max(1, ...points.map((p) => Math.max(p.delivered, p.failed || 0)));
  const line = (key, cls) => {
    const path = document.createElementNS(ns, 'polyline');
    const step = width / Math.max(points.length - 1, 1);
    path.setAttribute('points', points.map((p, i) => `${(i * step).toFixed(1)},${(height - (p[key] / top) * height).toFixed(1)}`).join(' '));
    path.setAttribute('class', cls);
    svg.append(path);
  };
  const axis = document.createElementNS(ns, 'line');
  axis.setAttribute('x1', '0'); axis.setAttribute('x2', String(width));
  axis.setAttribute('y1', String(height)); axis.setAttribute('y2', String(height));
  axis.setAttribute('class', 'axis');
  svg.append(axis);
  line('delivered', 'delivered');
  if (failures) line('failed', 'failed');
  const label = document.createElementNS(ns, 'text');
  label.setAttribute('x', '4'); label.setAttribute('y', String(height + 16));
  const lastPoint = points[points.length - 1] || { delivered: 0, failed: 0 };
  const failed = failures ? `, ${lastPoint.failed.toFixed(1)} failed/s` : '';
  label.textContent = `now: ${lastPoint.delivered.toFixed(1)} delivered/s${failed} · peak ${top.toFixed(1)}/s · last ${points.length} s`;
  svg.append(label);
  return svg;
}

// Jobs: by tenant, state and topic, paged, with a lookup by id.
function jobsPage(params) {
  const tenant = pageTenant(params);
  const stateSelect = el('select', { name: 'state' }, el('option', { value: '' }, 'any state'),
    STATES.map((s) => el('option', { value: s, selected: params.get('state') === s }, s)));
  const topic = el('input', { name: 'topic', placeholder: 'topic', value: params.get('topic') || '' });
  const lookup = el('input', { name: 'id', id: 'lookup', placeholder: 'job id' });
  const list = el('div', { id: 'jobs' });
  const more = el('button', { type: 'button', hidden: true }, 'Next page');
  let cursor = null;
  const load = (reset) => attempt(async () => {
    if (reset) cursor = null;
    const query = new URLSearchParams({ limit: '50' });
    if (tenant) query.set('tenant', tenant);
    if (stateSelect.value) query.set('state', stateSelect.value);
    if (topic.value.trim()) query.set('topic', topic.value.trim());
    if (cursor) query.set('cursor', cursor);
    const page = await api('GET', '/v1/jobs?' + query);
    cursor = page.next_cursor;
    more.hidden = !cursor;
    list.replaceChildren(table(['id', 'tenant', 'state', 'topic', 'attempts', 'next attempt', 'url'],
      page.jobs.map((j) => [
        jobLink(j.id, j.tenant), j.tenant, j.state, j.topic,
        `${j.attempts}/${j.max_attempts}`, fmtTime(j.next_attempt_at), j.url || '–',
      ]), 'No jobs match.'));
    painted();
  });
  more.addEventListener('click', () => load(false));
  // The filters go into the URL, so a reload or a shared link shows the
  // same list; the hash change lists it.
  const filter = () => {
    const target = listHash('jobs', tenantSelect.value,
      [['state', stateSelect.value], ['topic', topic.value.trim()]]);
    if (location.hash === target) load(true);
    else location.hash = target;
  };
  const tenantSelect = tenantFilter(tenant, filter);
  // A job looked up by id is the chosen tenant's (none chosen: `default`).
  const open = () => {
    const id = lookup.value.trim();
    if (id) location.hash = '#/job/' + encodeURIComponent(id) + tq(tenantSelect.value || 'default');
  };
  show(el('h1', {}, 'Jobs'),
    el('form', { class: 'row', onsubmit: (e) => { e.preventDefault(); filter(); } },
      tenantSelect, stateSelect, topic, el('button', { type: 'submit' }, 'List')),
    el('form', { class: 'row', onsubmit: (e) => { e.preventDefault(); open(); } },
      lookup, el('button', { type: 'submit' }, 'Open job')),
    list, more);
  load(true);
}

// One job of one tenant: its fields, headers (names only), body as text,
// history; `note`, if given, above them (what the last action did).
function jobPage(id, params, note) {
  const tenant = itemTenant(params);
  const path = '/v1/jobs/' + encodeURIComponent(id) + tq(tenant);
  const at = location.hash;
  show(el('h1', {}, 'Job ', el('code', {}, id)), el('p', { class: 'muted' }, 'Loading…'));
  attempt(async () => {
    let job;
    try {
      job = await api('GET', path);
    } catch (e) {
      if (e.status === 404) {
        showAt(at, el('h1', {}, 'Job ', el('code', {}, id)), el('p', { class: 'error', id: 'not-found' }, `No job with this id in tenant ${tenant}.`));
        return;
      }
      throw e;
    }
    const body = job.body !== undefined ? JSON.stringify(job.body, null, 2) : job.body_text;
    const fields = [
      ['tenant', job.tenant], ['state', job.state], ['topic', job.topic], ['url', job.url ? `${job.method} ${job.url}` : '– (finished; only its summary is kept)'],
      ['attempts', `${job.attempts} of ${job.max_attempts}`], ['next attempt', fmtTime(job.next_attempt_at)],
      ['created', fmtTime(job.created_at)], ['updated', fmtTime(job.updated_at)],
      ['retry', !job.retry ? 'the default ladder' : job.retry.length ? job.retry.join(', ') : 'none (one attempt)'], ['timeout', job.timeout || 'default'],
    ];
    if (job.ordering_key) fields.push(['ordering key', job.ordering_key]);
    if (job.waiting_for) {
      fields.push(['waiting for', jobLink(job.waiting_for, job.tenant)]);
    }
    if (job.held_by) {
      fields.push(['key held by', jobLink(job.held_by, job.tenant)]);
      fields.push(['holder due', job.waiting_until ? fmtTime(job.waiting_until) : 'already (ready or in flight)']);
    }
    const headers = Object.keys(job.headers || {});
    const cancel = !['delivered', 'dead', 'cancelled'].includes(job.state) && can('write')
      ? el('button', { type: 'button', id: 'cancel', onclick: () => attempt(() => api('DELETE', path), (answer) => jobPage(id, params,
        // 202 {in_flight: true}: a worker had the job already.
        answer && answer.in_flight ? 'Cancelled; an attempt already under way may still arrive (none after it).' : null)) }, 'Cancel job')
      : null;
    showAt(at, el('h1', {}, 'Job ', el('code', {}, job.id)), note ? el('p', { class: 'ok', id: 'cancel-note' }, note) : null, cancel,
      table(['field', 'value'], fields),
      el('h2', {}, 'Headers'),
      headers.length ? el('p', {}, headers.join(', '), el('span', { class: 'muted' }, ' (values are write-only)')) : el('p', { class: 'muted' }, 'None.'),
      el('h2', {}, 'Body'),
      body === undefined || body === null ? el('p', { class: 'muted' }, 'None kept.') : el('pre', { id: 'body' }, body),
      el('h2', {}, 'Attempts'),
      table(['attempt', 'at', 'took', 'status', 'error', 'message'], (job.history || []).map((h) => [
        String(h.attempt ?? ''), fmtTime(h.at), h.duration_ms !== undefined ? h.duration_ms + ' ms' : '', String(h.status ?? '–'), h.error || '', h.message || '',
      ]), 'No attempt yet.'));
    painted();
  });
}

// Dead letters: filter (by tenant, topic, since), replay selected or all by
// filter (optionally to a new URL, dry run first), delete. Each call names
// the tenant of the dead letters it acts on.
function deadPage(params) {
  const tenant = pageTenant(params);
  const tenantSelect = tenantFilter(tenant, (t) => { location.hash = listHash('dead', t); });
  const topic = el('input', { name: 'topic', placeholder: 'topic' });
  const since = el('input', { name: 'since', placeholder: 'since (2h, RFC 3339)' });
  const url = el('input', { name: 'url', id: 'replay-url', placeholder: 'new URL (optional)', size: 40 });
  const list = el('div', { id: 'dead' });
  const report = el('div', { id: 'report' });
  let shown = [];
  const filter = () => {
    const query = new URLSearchParams({ limit: '200' });
    if (tenant) query.set('tenant', tenant);
    if (topic.value.trim()) query.set('topic', topic.value.trim());
    if (since.value.trim()) query.set('since', since.value.trim());
    return query;
  };
  const load = () => attempt(async () => {
    const page = await api('GET', '/v1/dead-letters?' + filter());
    shown = page.dead_letters;
    list.replaceChildren(table(['', 'job', 'tenant', 'topic', 'attempts', 'status', 'last error', 'dead at', ''],
      shown.map((d) => [
        can('admin') ? el('input', { type: 'checkbox', class: 'pick', value: d.id, 'data-tenant': d.tenant }) : '',
        jobLink(d.id, d.tenant), d.tenant, d.topic, String(d.attempts), String(d.last_status ?? '–'),
        d.last_error, fmtTime(d.dead_at),
        can('admin') ? el('button', { type: 'button', class: 'drop', 'data-tenant': d.tenant, onclick: () => attempt(() => api('DELETE', '/v1/dead-letters/' + encodeURIComponent(d.id) + tq(d.tenant)), load) }, 'Delete') : '',
      ]), 'No dead letters.'));
    painted();
  });
  // One replay per tenant (a replay of ids names one tenant); the report
  // names a job of another tenant than `default` `<tenant>/<id>` when the
  // replays span tenants.
  const replay = (bodies, dry) => attempt(async () => {
    const done = { replayed: [], already_live: [], not_found: [] };
    for (const body of bodies) {
      if (url.value.trim()) body.url = url.value.trim();
      body.dry_run = dry;
      const one = await api('POST', '/v1/dead-letters/replay', body);
      const name = (id) => (bodies.length > 1 && body.tenant !== 'default' ? `${body.tenant}/${id}` : id);
      for (const list of Object.keys(done)) done[list].push(...one[list].map(name));
    }
    report.replaceChildren(el('p', { class: dry ? 'muted' : 'ok' },
      `${dry ? 'Would replay' : 'Replayed'} ${done.replayed.length}: ${done.replayed.join(' ') || '–'}`,
      done.already_live.length ? ` · already live: ${done.already_live.join(' ')}` : '',
      done.not_found.length ? ` · not found: ${done.not_found.join(' ')}` : ''));
    if (!dry) load();
  });
  const selected = () => {
    const byTenant = new Map();
    for (const c of document.querySelectorAll('input.pick:checked')) {
      if (!byTenant.has(c.dataset.tenant)) byTenant.set(c.dataset.tenant, []);
      byTenant.get(c.dataset.tenant).push(c.value);
    }
    // None picked: one request, which the API refuses with its reason.
    if (byTenant.size === 0) return [{ ids: [] }];
    return [...byTenant].map(([t, ids]) => ({ tenant: t, ids }));
  };
  const byFilter = () => {
    const body = { all: true };
    if (tenant) body.tenant = tenant;
    if (topic.value.trim()) body.topic = topic.value.trim();
    if (since.value.trim()) body.since = since.value.trim();
    return [body];
  };
  const actions = can('admin') ? el('div', { class: 'row' }, url,
    el('button', { type: 'button', id: 'preview', onclick: () => replay(selected(), true) }, 'Preview selected'),
    el('button', { type: 'button', id: 'replay-selected', onclick: () => replay(selected(), false) }, 'Replay selected'),
    el('button', { type: 'button', id: 'preview-all', onclick: () => replay(byFilter(), true) }, 'Preview all matching'),
    el('button', { type: 'button', id: 'replay-all', onclick: () => replay(byFilter(), false) }, 'Replay all matching'))
    : el('p', { class: 'muted' }, 'Replaying and deleting need a key with the admin scope.');
  show(el('h1', {}, 'Dead letters'),
    el('form', { class: 'row', onsubmit: (e) => { e.preventDefault(); load(); } }, tenantSelect, topic, since, el('button', { type: 'submit' }, 'Filter')),
    actions, report, list);
  load();
}

// Hosts (shared by every tenant): breaker state, waiting and in flight,
// pause and resume (an admin key bound to no tenant).
function hostsPage() {
  const list = el('div', { id: 'hosts' });
  show(el('h1', {}, 'Hosts'), list);
  const act = (host, action) => attempt(() => api('POST', `/v1/hosts/${encodeURIComponent(host)}/${action}`), refresh);
  const refresh = () => attempt(async () => {
    const page = await api('GET', '/v1/hosts?limit=200');
    list.replaceChildren(table(['host', 'state', 'waiting', 'in flight', 'concurrency', 'rate', 'reason', ''],
      page.hosts.map((h) => [
        h.host, h.state, String(h.waiting), String(h.in_flight), String(h.concurrency), String(h.rate), h.reason || '',
        can('admin') && !session.tenant ? el('button', { type: 'button', class: h.state === 'closed' ? 'pause' : 'resume', onclick: () => act(h.host, h.state === 'closed' ? 'pause' : 'resume') }, h.state === 'closed' ? 'Pause' : 'Resume') : '',
      ]), 'No host has been called yet.'));
    painted();
  });
  every(2000, refresh);
}

// Schedules: each with its state, rule, next and last run; pause and resume.
function scheduleWhen(s) {
  return s.cron ? `cron ${s.cron} (${s.timezone})` : `every ${s.every}`;
}

/** Pauses or resumes schedule `s` (of its tenant), then calls `done`. */
function pauseButton(s, done) {
  if (!can('write') || s.state === 'ended') return '';
  const action = s.state === 'paused' ? 'resume' : 'pause';
  const path = `/v1/schedules/${encodeURIComponent(s.id)}/${action}` + tq(s.tenant);
  return el('button', { type: 'button', class: action, 'data-schedule': s.id, 'data-tenant': s.tenant, onclick: () => attempt(() => api('POST', path), done) },
    action === 'pause' ? 'Pause' : 'Resume');
}

function lastRun(run) {
  return run ? `${fmtTime(run.at)} ${run.outcome}` : '–';
}

function schedulesPage(params) {
  const tenant = pageTenant(params);
  const list = el('div', { id: 'schedules' });
  show(el('h1', {}, 'Schedules'),
    el('div', { class: 'row' }, tenantFilter(tenant, (t) => { location.hash = listHash('schedules', t); })), list);
  const refresh = () => attempt(async () => {
    const page = await api('GET', '/v1/schedules?limit=200' + (tenant ? '&tenant=' + encodeURIComponent(tenant) : ''));
    list.replaceChildren(table(['schedule', 'tenant', 'state', 'when', 'next run', 'last run', ''],
      page.schedules.map((s) => [
        scheduleLink(s.id, s.tenant), s.tenant, s.state, scheduleWhen(s),
        fmtTime(s.next_runs[0]), lastRun(s.last_runs[0]), pauseButton(s, refresh),
      ]), 'No schedule yet.'));
    painted();
  });
  every(2000, refresh);
}

function schedulePage(id, params) {
  const tenant = itemTenant(params);
  const at = location.hash;
  const refresh = () => attempt(async () => {
    let s;
    try {
      s = await api('GET', '/v1/schedules/' + encodeURIComponent(id) + tq(tenant));
    } catch (e) {
      if (e.status === 404) {
        showAt(at, el('h1', {}, 'Schedule ', el('code', {}, id)), el('p', { class: 'error', id: 'not-found' }, `No schedule with this id in tenant ${tenant}.`));
        return;
      }
      throw e;
    }
    showAt(at, el('h1', {}, 'Schedule ', el('code', {}, s.id)), pauseButton(s, refresh),
      table(['field', 'value'], [
        ['tenant', s.tenant], ['state', s.state], ['when', scheduleWhen(s)], ['overlap', s.overlap], ['catch up', s.catch_up],
        ['starts', fmtTime(s.start_at)], ['ends', fmtTime(s.end_at)],
        ['job', `${s.job.method || 'POST'} ${s.job.url}`],
      ]),
      el('h2', {}, 'Next runs'),
      el('ul', { id: 'next-runs' }, s.next_runs.map((t) => el('li', {}, fmtTime(t)))),
      el('h2', {}, 'Last runs'),
      table(['at', 'outcome', 'job'], s.last_runs.map((r) => [
        fmtTime(r.at), r.outcome,
        r.outcome === 'fired' ? jobLink(r.job_id, s.tenant) : r.job_id,
      ]), 'Not fired yet.'));
    painted();
  });
  every(2000, refresh);
}

// ---- Start -------------------------------------------------------------

window.addEventListener('hashchange', route);
document.getElementById('logout').addEventListener('click', () => {
  sessionStorage.removeItem(KEY_STORE);
  session.key = null;
  login();
});
start();
