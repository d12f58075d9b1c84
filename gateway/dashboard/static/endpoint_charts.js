// The endpoint panel: picking a row of the endpoints view opens, below the table, the endpoint's
// last hour (or 15 or 2 minutes) in charts: requests per second, latency P50/P95/P99, error rate,
// ready and wanted replicas, its line (peak depth and 429s per 10 s) and the time spent in it, with
// the events that changed its scale marked on every chart.
//
// One read feeds them all: GET /v1/endpoints/{id}/traffic (10-second buckets of the traffic this
// gateway proxied, from its memory; replica counts and scale events from the endpoint's events in
// the log). It is read when the panel opens, every 5 s with the view's own refresh (not while the
// browser tab is hidden), and at once when the feed says the endpoint changed; each read replaces
// every line. A bucket with no request has no latency (the line spans it) but zero requests per
// second; the replica counts are steps, drawn to now.

import {$, badge, dash, fmt, h, report} from './dom.js';
import {api} from './api.js';
import {LiveChart} from './charts.js';

const WINDOWS = [[120, 'last 2 min'], [900, 'last 15 min'], [3600, 'last hour']];
const HEIGHT = 170;
const STEP_S = 0.001; // a replica count changes at t: the old count is drawn to just before it
const RECOVERY = new Set(['endpoint.replica_lost', 'endpoint.failed']);

const ms = (v) => (v == null ? dash : fmt.ms(v));
/** uPlot's points.show: a line's points are drawn while it has few values (a lone bucket shows). */
const sparse = (u, i) => u.data[i].reduce((n, v) => n + (v != null), 0) * 8 <= u.bbox.width / (devicePixelRatio || 1);
const count = (v) => (v == null ? dash : fmt.int(v));

/** The charts, each with its lines and how a bucket gives their points. */
const CHARTS = [
  {title: 'Requests per second', y: 'req/s', format: (v) => (v == null ? dash : fmt.rate(v)),
    lines: {'requests/s': (b) => b?.rps ?? 0}},
  {title: 'Latency', y: 'ms', format: ms,
    lines: {P50: (b) => b?.p50_ms, P95: (b) => b?.p95_ms, P99: (b) => b?.p99_ms}},
  {title: 'Error rate', y: '%', format: (v) => (v == null ? dash : `${v.toFixed(1)}%`),
    lines: {errors: (b) => (b?.requests ? b.error_rate * 100 : null)}},
  {title: 'Replicas', y: 'replicas', format: count, lines: {ready: null, wanted: null}},
  {title: 'Line', y: 'requests', format: count,
    lines: {'waiting (peak)': (b) => b?.queue_depth ?? 0, 'refused (429)': (b) => b?.rejected ?? 0}},
  {title: 'Wait in line', y: 'ms', format: ms,
    lines: {P50: (b) => b?.wait_p50_ms, P99: (b) => b?.wait_p99_ms}},
];

/** Every chart's lines from one answer: {title: {label: [[x, y], ...]}}. Buckets are drawn at their
 * start, every bucket of the window (a missing one: nothing happened in it). */
export function chartLines(history) {
  const {now, window_s: span, bucket_s: step} = history;
  const since = now - span;
  const byStart = new Map(history.traffic.map((b) => [b.t, b]));
  const starts = [];
  for (let t = Math.ceil(since / step) * step; t <= now; t += step) starts.push(t);
  const out = {};
  for (const chart of CHARTS) {
    if (chart.title === 'Replicas') continue;
    out[chart.title] = Object.fromEntries(Object.entries(chart.lines).map(([label, of]) =>
      [label, framed(starts.map((t) => [t, of(byStart.get(t)) ?? null]), since, now)]));
  }
  out.Replicas = replicaLines(history.replicas, since, now);
  return out;
}

/** The replica counts as steps, from the window's start (or the deployment) to now. */
function replicaLines(counts, since, now) {
  const lines = {ready: [], wanted: []};
  counts.forEach((c, i) => {
    if (i > 0) {
      lines.ready.push([c.t - STEP_S, counts[i - 1].ready]);
      lines.wanted.push([c.t - STEP_S, counts[i - 1].wanted]);
    }
    lines.ready.push([c.t, c.ready]);
    lines.wanted.push([c.t, c.wanted]);
  });
  const last = counts[counts.length - 1];
  if (last && last.t < now) {
    lines.ready.push([now, last.ready]);
    lines.wanted.push([now, last.wanted]);
  }
  return {ready: framed(lines.ready, since, now), wanted: framed(lines.wanted, since, now)};
}

/** Points with the window's edges added (empty), so that every chart spans the same time. */
function framed(points, since, now) {
  const xs = new Set(points.map(([x]) => x));
  return [...(xs.has(since) ? [] : [[since, null]]), ...points, ...(xs.has(now) ? [] : [[now, null]])];
}

export const endpointPanel = {
  open: null, // {id, window, charts: Map(title -> LiveChart), reading, again}
  select: () => {},

  /** Show the endpoint `id` (its row's copy `e`, for the heading). */
  async show(id, e) {
    const span = this.open?.window || 3600; // the window picked stays for the next endpoint
    this.close();
    this.select(id);
    const open = {id, window: span, charts: new Map(), reading: false, again: false};
    this.open = open;
    const panel = $('endpoint-detail');
    const pick = h('select', {id: 'endpoint-window', 'aria-label': 'window'},
      WINDOWS.map(([s, text]) => h('option', {value: s, selected: s === open.window}, text)));
    pick.addEventListener('change', () => {
      open.window = Number(pick.value);
      this.refresh();
    });
    const grid = h('div', {class: 'charts'});
    panel.replaceChildren(
      h('header', {},
        h('h2', {id: 'endpoint-title'}, e?.spec.name || id),
        pick,
        h('button', {class: 'quiet', type: 'button', 'aria-label': 'close', onclick: () => this.close()}, '\u00d7')),
      h('p', {class: 'count'}, 'Traffic through this gateway, in 10-second buckets (kept in its memory for an hour: another ' +
        'gateway counts its own, and a restart starts afresh); replicas and scale events from the endpoint\u2019s events.'),
      h('div', {id: 'endpoint-stats', class: 'stats'}),
      grid,
    );
    panel.hidden = false;
    if (e) this.heading(e);
    for (const spec of CHARTS) {
      const chart = new LiveChart({title: spec.title, x: 'time', y: spec.y, height: HEIGHT, format: spec.format,
        lines: Object.keys(spec.lines), points: spec.title === 'Replicas' ? false : sparse});
      open.charts.set(spec.title, chart);
      grid.append(chart.node);
    }
    await Promise.all([...open.charts.values()].map((c) => c.mount()));
    if (this.open === open) await this.refresh();
    else for (const chart of open.charts.values()) chart.destroy(); // closed while they were built
  },

  /** The endpoint as its row now holds it: the heading's name and state. */
  heading(e) {
    if (this.open?.id !== e.endpoint_id) return;
    $('endpoint-title').replaceChildren(e.spec.name, ' ', badge(e.state));
  },

  close() {
    const open = this.open;
    this.open = null;
    for (const chart of open?.charts.values() || []) chart.destroy();
    $('endpoint-detail').hidden = true;
    $('endpoint-detail').replaceChildren();
    this.select(null);
  },

  /** Read the window again and redraw (one read at a time; a call meanwhile reads once more after). */
  async refresh() {
    const open = this.open;
    if (!open) return;
    if (open.reading) {
      open.again = true;
      return;
    }
    open.reading = true;
    try {
      const history = await api(`/v1/endpoints/${encodeURIComponent(open.id)}/traffic`,
        {scope: 'tenant', query: {window_s: open.window}});
      if (this.open === open) this.draw(open, history);
    } catch (error) {
      if (this.open === open) report(error);
    } finally {
      open.reading = false;
      if (open.again && this.open === open) {
        open.again = false;
        this.refresh();
      }
    }
  },

  draw(open, history) {
    const lines = chartLines(history);
    for (const [title, chart] of open.charts) {
      chart.replace(lines[title]);
      const shown = Object.values(lines[title]).reduce((n, points) => n + points.filter(([, y]) => y != null).length, 0);
      chart.node.dataset.values = String(shown); // points with a value (the edges carry none)
      for (const e of history.scale_events) chart.mark(e.t, e.label, RECOVERY.has(e.type) ? 'recovery' : 'scale');
    }
    this.stats(history);
  },

  /** The window in figures: requests and errors over it, the latest bucket's latencies, replicas now. */
  stats(history) {
    const served = history.traffic.filter((b) => b.requests);
    const requests = served.reduce((n, b) => n + b.requests, 0);
    const errors = served.reduce((n, b) => n + b.errors, 0);
    const latest = served[served.length - 1];
    const now = history.replicas[history.replicas.length - 1];
    const stat = (col, name, value, title) =>
      h('span', {dataset: {col}, title: title || null}, `${name} `, h('span', {class: 'v'}, value));
    $('endpoint-stats').replaceChildren(
      stat('requests', 'requests', fmt.int(requests)),
      stat('errors', 'errors', requests ? fmt.share(errors / requests) : dash),
      ...['p50', 'p95', 'p99'].map((q) => stat(q, q.toUpperCase(), latest ? fmt.ms(latest[`${q}_ms`]) : dash,
        latest ? `latest bucket with traffic, from ${new Date(latest.t * 1000).toLocaleTimeString()}` : null)),
      stat('replicas', 'replicas', now ? `${now.ready}/${now.wanted} ready` : dash),
      stat('refused', 'refused (429)', fmt.int(history.traffic.reduce((n, b) => n + b.rejected, 0))),
    );
  },
};
