// The jobs view: a table of the tenant's jobs (newest first, 100 per page through the API's cursor),
// rows updated in place from the feed, and a detail panel with the job's live charts (jobcharts.js), its
// events and a cancel button.
//
// How the feed updates a row: a job.progress event is applied to the row directly (it carries the
// new round, epoch, step and loss), with the same fencing as the schedule reducer
// (projections/schedule.py: a shard's event counts only from its current assignment); any other job
// event re-reads the job from the API, which has the authoritative state, assignments and why it
// waits. A telemetry message gives the GPU utilisation of the workers running the job.

import {$, badge, dash, fmt, h, report, timeCell} from './dom.js';
import {api, session} from './api.js';
import {LiveList, listView, miniTable} from './table.js';
import {JobCharts} from './jobcharts.js';

const TERMINAL = new Set(['completed', 'failed', 'cancelled']);

/** Whether a progress event comes from the job's current placement (mirrors the reducer's fence). */
export function current(job, event) {
  const bySlot = new Map(job.assignments.map((a) => [a.slot, a]));
  if (event.slot != null) {
    const held = bySlot.get(event.slot);
    return held != null && (event.epoch == null || held.epoch === event.epoch);
  }
  if (event.epoch == null) return true;
  if (!job.assignments.length) return false;
  const epochs = job.assignments.map((a) => a.epoch);
  return Math.min(...epochs) <= event.epoch && event.epoch <= Math.max(...epochs);
}

/** The job with a progress event folded in (values the event leaves out keep their previous value). */
export function withProgress(job, e) {
  const p = job.progress || {metrics: {}};
  const pick = (value, previous) => (value == null ? previous : value);
  const progress = {
    round: pick(e.round, p.round),
    epoch: pick(e.train_epoch, p.epoch),
    step: pick(e.step, p.step),
    loss: pick(e.loss, p.loss),
    gpu_util_pct: pick(e.gpu_util_pct, p.gpu_util_pct),
    metrics: e.metrics && Object.keys(e.metrics).length ? e.metrics : p.metrics,
  };
  return {...job, progress};
}

function progressText(p, job) {
  if (!p) return dash;
  const parts = [];
  if (p.round != null) parts.push(`round ${p.round}${job.spec.rounds ? `/${job.spec.rounds}` : ''}`);
  if (p.epoch != null) parts.push(`epoch ${p.epoch}`);
  if (p.step != null) parts.push(`step ${fmt.int(p.step)}`);
  return parts.join(' \u00b7 ') || dash;
}

/** An event body for the events table: as sent, without its type, empty fields or environment
 * values (masked), at most 300 characters. */
function summary(event) {
  const shown = {};
  for (const [name, value] of Object.entries(event)) {
    const empty = value == null || value === '' || (typeof value === 'object' && !Object.keys(value).length);
    if (name !== 'type' && !empty) shown[name] = value;
  }
  if (shown.env && typeof shown.env === 'object') {
    shown.env = Object.fromEntries(Object.keys(shown.env).map((name) => [name, '<redacted>']));
  }
  const text = JSON.stringify(shown);
  return text.length > 300 ? `${text.slice(0, 299)}\u2026` : text;
}

export const jobs = {
  ...listView,
  gpu: new Map(), // job_id -> Map(worker -> mean GPU utilisation)
  detail: null, // {id, job, events: Set(seq), next, loading, live: []}
  charts: null, // the open job's JobCharts

  init() {
    this.list = new LiveList({
      name: 'jobs',
      noun: 'job',
      key: (job) => job.job_id,
      page: (after, limit) => api('/v1/jobs', {scope: 'tenant', query: {...this.filter(), limit, after}}),
      one: (id) => api(`/v1/jobs/${encodeURIComponent(id)}`, {scope: 'tenant'}),
      render: (job, tr) => this.render(job, tr),
      handle: (m) => this.handle(m),
      keeps: (job) => this.matches(job),
      pick: (id) => this.open(id),
      applied: (id, job) => {
        if (this.detail?.id === id && job != null) this.showJob(job);
      },
      onError: report,
    });
    $('jobs-more').addEventListener('click', () => this.list.loadPage());
    $('jobs-state').addEventListener('change', () => this.reload());
    let typing = null;
    $('jobs-prefix').addEventListener('input', () => {
      clearTimeout(typing);
      typing = setTimeout(() => this.reload(), 300);
    });
  },

  filter() {
    return {state: $('jobs-state').value, name_prefix: $('jobs-prefix').value.trim()};
  },

  matches(job) {
    const f = this.filter();
    return (!f.state || job.state === f.state) && (!f.name_prefix || job.spec.name.startsWith(f.name_prefix));
  },

  reset() {
    this.list.reset();
    this.gpu.clear();
    this.close();
  },

  handle(m) {
    if (m.kind === 'telemetry') {
      this.telemetry(m);
      return;
    }
    const id = m.job;
    const job = this.list.item(id);
    if (m.kind === 'job.progress' && job && !this.list.busy(id)) {
      if (current(job, m.event)) this.list.apply(id, withProgress(job, m.event));
    } else if (this.list.has(id) || m.kind === 'job.submitted' || this.detail?.id === id) {
      // new since the list was read: goes on top; while its first read is in flight, read it again
      this.list.changed(id, m.kind === 'job.submitted');
    }
    if (this.detail?.id === id) {
      this.liveEvent(m);
      this.charts?.event(m);
    }
  },

  telemetry(m) {
    const readings = (m.event?.gpus || []).map((g) => g.util_pct).filter((u) => u != null);
    const mean = readings.length ? readings.reduce((a, b) => a + b, 0) / readings.length : null;
    for (const id of m.jobs || []) {
      if (!this.gpu.has(id)) this.gpu.set(id, new Map());
      this.gpu.get(id).set(m.worker, mean);
      this.list.redraw(id);
    }
    this.charts?.telemetry(m);
  },

  gpuUtil(job) {
    if (TERMINAL.has(job.state)) return null;
    const values = [...(this.gpu.get(job.job_id)?.values() || [])].filter((u) => u != null);
    if (values.length) return values.reduce((a, b) => a + b, 0) / values.length;
    return job.progress?.gpu_util_pct ?? null;
  },

  render(job, tr) {
    const workers = job.assignments.map((a) => a.worker_id);
    const waiting = job.state === 'queued' ? job.pending_reason : job.state === 'failed' ? job.failure_reason : '';
    tr.replaceChildren(
      h('td', {}, h('span', {}, job.spec.name), h('span', {class: 'sub'}, job.job_id)),
      h('td', {class: 'nowrap', dataset: {col: 'state'}}, badge(job.state)),
      h('td', {dataset: {col: 'progress'}}, progressText(job.progress, job)),
      h('td', {class: 'num', dataset: {col: 'loss'}}, fmt.loss(job.progress?.loss)),
      h('td', {class: 'num', dataset: {col: 'gpu'}}, fmt.pct(this.gpuUtil(job))),
      h(
        'td',
        {class: 'nowrap', dataset: {col: 'shards'}, title: workers.join(', ') || null},
        `${job.assignments.length}/${job.spec.shards} placed`,
        workers.length ? h('span', {class: 'sub'}, workers.slice(0, 2).join(', ') + (workers.length > 2 ? ', \u2026' : '')) : null,
      ),
      timeCell(job.submitted_at),
      h('td', {class: 'reason', dataset: {col: 'reason'}}, waiting || ''),
    );
  },

  // -- the detail panel ------------------------------------------------------------------------

  open(id) {
    this.list.select(id);
    const panel = $('job-detail');
    this.detail = {id, events: new Set(), next: null, loading: false, live: [], armed: null};
    const cancel = h('button', {class: 'danger', type: 'button', id: 'job-cancel', hidden: true}, 'Cancel job');
    cancel.addEventListener('click', () => this.cancel(cancel));
    const more = h('button', {class: 'more', type: 'button', id: 'job-events-more', hidden: true}, 'More events');
    this.charts?.destroy();
    this.charts = new JobCharts(id);
    more.addEventListener('click', () => this.loadEvents());
    panel.replaceChildren(
      h('header', {},
        h('h2', {id: 'job-title'}, this.list.item(id)?.spec.name || id),
        h('button', {class: 'quiet', type: 'button', 'aria-label': 'close', onclick: () => this.close()}, '\u00d7')),
      h('div', {class: 'actions'}, cancel),
      h('div', {id: 'job-summary'}),
      this.charts.node,
      h('h3', {}, 'Events'),
      miniTable(['Seq', 'Time', 'Type', 'Body'], [], {id: 'job-events'}),
      more,
    );
    panel.hidden = false;
    const job = this.list.item(id);
    if (job) this.showJob(job);
    this.list.changed(id); // the list's copy has no "why": read the job itself
    this.loadEvents();
    this.charts.load();
  },

  close() {
    this.detail = null;
    this.charts?.destroy();
    this.charts = null;
    $('job-detail').hidden = true;
    $('job-detail').replaceChildren();
    this.list.select(null);
  },

  showJob(job) {
    const d = this.detail;
    if (!d || d.id !== job.job_id) return;
    d.job = job;
    $('job-title').replaceChildren(job.spec.name, ' ', badge(job.state));
    const cancel = $('job-cancel');
    cancel.hidden = !session.canWrite || TERMINAL.has(job.state);
    const r = job.spec.resources;
    const resources = `${r.gpus ? `${r.gpus} GPU${r.gpus > 1 ? 's' : ''}${r.gpu_type ? ` ${r.gpu_type}` : ''}` : 'CPU'}` +
      `${r.vram_mb ? `, ${fmt.mb(r.vram_mb)} VRAM` : ''}, ${r.cpus} CPU, ${fmt.mb(r.memory_mb)}`;
    const kv = (name, value) => (value == null || value === '' ? [] : [h('dt', {}, name), h('dd', {}, value)]);
    const p = job.progress;
    const parts = [
      h('dl', {class: 'kv'},
        kv('Job id', h('code', {}, job.job_id)),
        kv('Kind', job.spec.kind),
        kv('Shards', `${job.assignments.length}/${job.spec.shards} placed`),
        kv('Resources', resources),
        kv('Pool', `${job.spec.pool}${job.spec.region ? `, ${job.spec.region}` : ''}, priority ${job.spec.priority}`),
        kv('Progress', p ? `${progressText(p, job)}${p.loss != null ? `, loss ${fmt.loss(p.loss)}` : ''}` : null),
        kv('Checkpoint', job.last_checkpoint ? h('code', {}, job.last_checkpoint.object_key) : null),
        kv('Submitted', `${fmt.time(job.submitted_at)} by ${job.spec.submitted_by}`),
        kv('Ended', job.ended_at ? fmt.time(job.ended_at) : null),
        kv('Cancelled by', job.cancelled_by || null),
        kv('Failure', job.failure_reason || null),
        kv('Command', job.spec.command.length ? h('code', {}, job.spec.command.join(' ')) : null),
        kv('Environment', Object.keys(job.spec.env).sort().join(', ') || null),
        kv('Inputs', job.spec.inputs.join(', ') || null),
        kv('Outputs', job.outputs.join(', ') || null)),
    ];
    if (job.why?.length) parts.push(h('h3', {}, 'Why'), h('ul', {class: 'why'}, job.why.map((line) => h('li', {}, line))));
    if (job.assignments.length) {
      parts.push(h('h3', {}, 'Assignments'), miniTable(['Shard', 'Worker', 'Epoch', 'GPUs', 'State'],
        job.assignments.map((a) => [a.slot, h('code', {}, a.worker_id), a.epoch, a.gpus,
          a.done ? 'done' : ['failed', 'cancelled'].includes(job.state) ? 'stopped' : a.started ? 'started' : 'placed'])));
    }
    if (job.log_tail) parts.push(h('h3', {}, 'Log tail'), h('pre', {class: 'log'}, job.log_tail));
    $('job-summary').replaceChildren(...parts);
  },

  async cancel(button) {
    const d = this.detail;
    if (!d) return;
    if (d.armed == null) { // a second click within 4 s confirms
      button.textContent = 'Confirm cancel';
      button.classList.add('armed');
      d.armed = setTimeout(() => {
        d.armed = null;
        button.textContent = 'Cancel job';
        button.classList.remove('armed');
      }, 4000);
      return;
    }
    clearTimeout(d.armed);
    d.armed = null;
    button.disabled = true;
    try {
      const job = await api(`/v1/jobs/${encodeURIComponent(d.id)}/cancel`, {method: 'POST', scope: 'tenant'});
      this.list.apply(d.id, job);
    } catch (error) {
      report(error);
    } finally {
      button.disabled = false;
      button.textContent = 'Cancel job';
      button.classList.remove('armed');
    }
  },

  async loadEvents() {
    const d = this.detail;
    if (!d || d.loading) return;
    d.loading = true;
    $('job-events-more').disabled = true;
    try {
      const page = await api(`/v1/jobs/${encodeURIComponent(d.id)}/events`, {
        scope: 'tenant',
        query: {limit: 100, after: d.next},
      });
      if (this.detail !== d) return;
      for (const item of page.items) this.addEvent(item.seq, item.time, item.type, item.event);
      d.next = page.next || null;
    } catch (error) {
      if (this.detail === d) report(error);
    } finally {
      d.loading = false;
      if (this.detail === d) {
        $('job-events-more').disabled = false;
        $('job-events-more').hidden = !d.next;
        for (const m of d.live.splice(0)) this.liveEvent(m);
      }
    }
  },

  /** A feed event of the open job: appended once every earlier event is shown. */
  liveEvent(m) {
    const d = this.detail;
    if (m.kind === 'telemetry' || !d) return;
    if (d.loading) d.live.push(m);
    else if (!d.next) this.addEvent(m.seq, m.time, m.kind, m.event);
  },

  addEvent(seq, time, type, event) {
    const d = this.detail;
    if (d.events.has(seq)) return;
    d.events.add(seq);
    $('job-events').tBodies[0].append(h('tr', {dataset: {seq}},
      h('td', {}, seq), timeCell(time), h('td', {}, type), h('td', {class: 'body'}, summary(event))));
  },
};
