// The endpoints view: the tenant's inference endpoints with their state (and why: the reason of the
// latest scaling, a lost replica's reason), ready/desired replicas, each replica's state and address,
// and their traffic through the gateway over the last 60 s (requests, RPS, error rate, P50/P95/P99),
// and their line: requests waiting for a replica and held by one now, time in line, 429s.
//
// Two sources keep a row current. State changes are events on the feed (deployed, replica placed,
// ready, lost, scaled, scaled to zero, deleted): each re-reads that endpoint at once. Traffic is not
// an event (it is counted in the gateway's memory, per request), so while this view is shown the
// rows shown are re-read every 5 s from the list endpoint, one request per 200 rows whatever the
// number of endpoints, and not at all while the browser tab is hidden.
//
// Picking a row opens the endpoint's last hour in charts below the table (endpoint_charts.js),
// refreshed with the rows and whenever the feed says that endpoint changed.

import {$, badge, dash, fmt, h, polling, report, timeCell} from './dom.js';
import {api} from './api.js';
import {LiveList, listView} from './table.js';
import {endpointPanel} from './endpoint_charts.js';

const TRAFFIC_EVERY_MS = 5_000;
const LIST_LIMIT = 200; // the most GET /v1/endpoints returns at once

/** Traffic figures as shown: requests, RPS, error rate, latencies (a dash when nothing was served). */
function trafficCells(t) {
  const none = !t || t.requests === 0;
  const cell = (col, text, title) => h('td', {class: 'num', dataset: {col}, title: title || null}, text);
  return [
    cell('requests', fmt.int(t?.requests ?? 0)),
    cell('rps', none ? '0' : fmt.rate(t.rps)),
    cell('errors', none ? dash : fmt.share(t.error_rate)),
    ...['p50', 'p95', 'p99'].map((q) => cell(q, none ? dash : fmt.ms(t[`${q}_ms`]), none ? null : `${t[`${q}_ms`]} ms`)),
    lineCell(t),
  ];
}

/** The line: waiting / in flight now, with the time in line and the refusals in its title. */
function lineCell(t) {
  const line = h('td', {class: 'num nowrap', dataset: {col: 'line'}});
  if (!t) return line;
  line.title = `wait in line p50 ${fmt.ms(t.wait_p50_ms)}, p99 ${fmt.ms(t.wait_p99_ms)}; ${fmt.int(t.rejected)} refused (429)`;
  line.append(`${fmt.int(t.queue_depth)} waiting \u00b7 ${fmt.int(t.in_flight)} in flight`);
  if (t.rejected) line.append(h('span', {class: 'sub reason'}, `${fmt.int(t.rejected)} refused`));
  return line;
}

function replicaLine(r) {
  return h('div', {class: 'replica', dataset: {slot: r.slot}},
    badge(r.state), ' ', h('span', {class: 'mono'}, r.worker_id),
    r.address || r.reason ? h('span', {class: r.reason ? 'sub reason' : 'sub'}, r.address || r.reason) : null);
}

export const endpoints = {
  ...listView,
  ...polling(TRAFFIC_EVERY_MS),

  init() {
    this.list = new LiveList({
      name: 'endpoints',
      noun: 'endpoint',
      key: (e) => e.endpoint_id,
      page: (after, limit) => api('/v1/endpoints', {
        scope: 'tenant',
        query: {limit, after, include_deleted: $('endpoints-deleted').checked ? 'true' : ''},
      }),
      one: (id) => api(`/v1/endpoints/${encodeURIComponent(id)}`, {scope: 'tenant'}),
      render: (e, tr) => this.render(e, tr),
      handle: (m) => this.handle(m),
      keeps: (e) => e.state !== 'deleted' || $('endpoints-deleted').checked,
      pick: (id) => endpointPanel.show(id, this.list.item(id)),
      applied: (id, e) => {
        if (e) endpointPanel.heading(e);
        else if (endpointPanel.open?.id === id) endpointPanel.close();
      },
      onError: report,
    });
    endpointPanel.select = (id) => this.list.select(id);
    $('endpoints-more').addEventListener('click', () => this.list.loadPage());
    $('endpoints-deleted').addEventListener('change', () => this.reload());
  },

  reset() {
    this.list.reset();
    endpointPanel.close();
  },

  poll() {
    if (document.hidden) return;
    this.list.refreshShown(LIST_LIMIT);
    endpointPanel.refresh();
  },

  handle(m) {
    if (!m.endpoint) return;
    if (endpointPanel.open?.id === m.endpoint) endpointPanel.refresh();
    const created = m.kind === 'endpoint.deployed';
    if (created || this.list.has(m.endpoint)) this.list.changed(m.endpoint, created);
  },

  render(e, tr) {
    const hardware = [e.spec.gpu_type || (e.spec.vram_mb ? 'any GPU' : 'any host'), e.spec.vram_mb ? `${fmt.mb(e.spec.vram_mb)} VRAM` : null,
      e.spec.engine || 'engine by host', e.spec.pool].filter(Boolean).join(' \u00b7 ');
    const zero = e.spec.scale_to_zero_after_s == null ? 'never to zero' : `to zero after ${e.spec.scale_to_zero_after_s} s idle`;
    tr.replaceChildren(
      h('td', {}, h('span', {}, e.spec.name), h('span', {class: 'sub'}, e.endpoint_id)),
      h('td', {}, h('span', {}, e.spec.model), h('span', {class: 'sub'},
        e.spec.model_source === 'workspace' ? `from workspace \u00b7 ${hardware}` : hardware)),
      h('td', {dataset: {col: 'state'}}, badge(e.state),
        e.scale_reason ? h('span', {class: 'sub reason', dataset: {col: 'why'}}, e.scale_reason) : null,
        e.last_failure_log_tail ? h('details', {dataset: {col: 'engine-log'}},
          h('summary', {class: 'sub'}, `engine log (${e.start_failures} failed in a row)`),
          h('pre', {class: 'log'}, e.last_failure_log_tail)) : null),
      h('td', {class: 'nowrap', dataset: {col: 'replicas'}}, `${e.ready_replicas}/${e.desired_replicas} ready`,
        h('span', {class: 'sub'}, `min ${e.spec.min_replicas}, max ${e.spec.max_replicas}, ${zero}`)),
      h('td', {dataset: {col: 'where'}}, e.replicas.length ? e.replicas.map(replicaLine) : dash),
      ...trafficCells(e.traffic),
      timeCell(e.deployed_at),
    );
  },
};
