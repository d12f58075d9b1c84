// The job view's charts: every metric the job reports (loss, then each `metrics` key) against its
// step, epoch or round, one line per shard (and, for a federated job, the aggregated line of each
// round's figures), with checkpoints and recoveries marked where they happened; and the GPU
// utilisation and memory of its workers over time.
//
// History: every page of GET /v1/jobs/{id}/events (however many: a reload or a late viewer sees the
// whole curve), then the feed's events of the job, skipping any the history already had (by JOBS
// sequence). Both are folded in log order as the schedule reducer folds them (projections/schedule.py):
// a shard's progress counts only from the shard's current assignment at that point of the log, so
// the points of a superseded epoch stay (they happened), but a report from an assignment that was
// revoked or replaced is never drawn, nor is anything after the job ended. A marker sits at the last
// x seen before its event (at the event's time on the GPU charts).
//
// GPU history comes from GET /v1/jobs/{id}/telemetry (the job's workers, only while they held its
// assignments, and only heartbeats of hosts that ran nothing else), then the feed's telemetry
// messages of workers that run this job alone among the tenant's work.

import {fmt, h, report} from './dom.js';
import {api} from './api.js';
import {LiveChart} from './charts.js';

const PAGE = 500; // the most GET /v1/jobs/{id}/events gives at once
const GPU_POINTS = 300; // samples per worker of the GPU history
const MAX_METRICS = 24; // charts beyond these are not drawn (a job may report any number of keys)
const LABEL_CHARS = 40;

const short = (text) => (text.length > LABEL_CHARS ? `${text.slice(0, LABEL_CHARS - 1)}\u2026` : text);

/**
 * One job's events folded into chart points and markers, as the schedule reducer sees them.
 * sink.point(metric, line, x, y) and sink.mark(kind, label, x, timeS) receive what to draw.
 */
export class JobCurves {
  constructor(sink) {
    this.sink = sink;
    this.spec = null;
    this.held = new Map(); // slot -> its current assignment
    this.placed = new Set(); // slots ever placed (a later placement of one is a new epoch)
    this.epoch = 0; // the highest assignment epoch placed
    this.round = 0; // the highest federated round completed
    this.ended = false;
    this.axis = null; // 'step', 'epoch' or 'round', from the first progress (federated: 'round')
    this.lastX = null;
    this.lineX = new Map(); // line -> its last x (a report without one keeps it)
  }

  get federated() {
    return this.spec?.kind === 'federated';
  }

  /** Fold one event (its tag, body and store time in Unix seconds), in log order. */
  apply(type, e, timeS) {
    if (type === 'job.submitted') {
      this.spec = e;
      if (this.federated) this.axis = 'round';
      return;
    }
    if (this.ended || !this.spec) return; // a job's end is final (the reducer's too)
    switch (type) {
      case 'job.placed': this.placedEvent(e, timeS); break;
      case 'job.assignment_revoked': this.revoked(e, timeS); break;
      case 'job.progress': if (!this.fenced(e.slot, e.epoch)) this.progress(e); break;
      case 'job.checkpointed': if (!this.fenced(e.slot, e.epoch)) this.checkpointed(e, timeS); break;
      case 'job.round_completed': this.roundCompleted(e); break;
      case 'job.federation_run':
        if (e.reason && e.reason !== 'start') this.mark('recovery', `FL run restarted at round ${e.first_round}`, timeS);
        break;
      case 'job.failed':
        if (!this.fenced(e.slot, e.epoch) && e.slot == null && !e.retryable) this.ended = true;
        break;
      case 'job.completed': case 'job.cancelled': this.ended = true; break;
      default:
    }
  }

  /** True if a shard's (or a job-wide) event of this epoch is stale: the reducer's fence. */
  fenced(slot, epoch) {
    if (slot != null) {
      const held = this.held.get(slot);
      return held == null || (epoch != null && epoch !== held.epoch);
    }
    if (epoch == null) return false; // the kernel's own
    if (!this.held.size) return true;
    const lowest = Math.min(...[...this.held.values()].map((a) => a.epoch));
    return !(lowest <= epoch && epoch <= this.epoch);
  }

  placedEvent(e, timeS) {
    const held = new Map(this.held);
    const again = [];
    let epoch = this.epoch;
    for (const a of e.assignments || []) {
      if (a.epoch <= this.epoch || a.slot < 0 || a.slot >= this.spec.shards) continue; // stale
      if (this.placed.has(a.slot)) again.push(a.slot);
      held.set(a.slot, a);
      epoch = Math.max(epoch, a.epoch);
    }
    if (epoch === this.epoch) return;
    this.held = held;
    this.epoch = epoch;
    for (const slot of held.keys()) this.placed.add(slot);
    if (again.length) this.mark('epoch', short(`epoch ${epoch}: shard ${again.join(', ')} re-placed`), timeS);
  }

  revoked(e, timeS) {
    const held = this.held.get(e.slot);
    if (held == null || held.assignment_id !== e.assignment_id) return; // already superseded
    this.held.delete(e.slot);
    this.mark('recovery', short(`shard ${e.slot}: ${e.reason || 'revoked'}`), timeS);
  }

  progress(e) {
    let line;
    if (e.slot != null) line = `shard ${e.slot}`;
    else if (this.federated) return; // the kernel's copy of a round's figures: the aggregated line
    else line = 'job';
    const x = this.xOf(line, e);
    if (x == null) return;
    const values = {...(e.metrics || {})};
    if (e.loss != null) values.loss = e.loss;
    for (const [metric, y] of Object.entries(values)) this.sink.point(metric, line, x, y);
    this.lastX = x;
  }

  /** The x of a progress report on its line: its step, epoch or round (a federated shard's local
   * epochs spread over its round), else the line's last x. */
  xOf(line, e) {
    this.axis ??= e.step != null ? 'step' : e.train_epoch != null ? 'epoch' : e.round != null ? 'round' : null;
    let x = null;
    if (this.axis === 'step') x = e.step;
    else if (this.axis === 'epoch') x = e.train_epoch;
    else if (this.axis === 'round' && e.round != null) {
      const local = this.spec.local_epochs || 1;
      x = this.federated && local > 1 && e.train_epoch != null ? e.round - 1 + Math.min(e.train_epoch, local) / local : e.round;
    }
    x ??= this.lineX.get(line) ?? null;
    if (x != null) this.lineX.set(line, x);
    return x;
  }

  checkpointed(e, timeS) {
    const own = this.axis === 'step' ? e.step : this.axis === 'round' ? e.round : null;
    this.mark('checkpoint', '', timeS, own ?? undefined); // unlabelled: one per round would crowd the plot
  }

  roundCompleted(e) {
    if (e.round <= this.round) return; // the reducer counts each round once
    this.round = e.round;
    if (this.axis !== 'round') return;
    for (const [metric, y] of Object.entries(e.metrics || {})) this.sink.point(metric, 'aggregated', e.round, y);
    this.lastX = e.round;
  }

  mark(kind, label, timeS, x = this.lastX ?? 0) {
    this.sink.mark(kind, label, x, timeS);
  }
}

/** The GPU readings of a telemetry message: mean utilisation (%) and memory used on all GPUs (MiB). */
export function gpuReadings(gpus) {
  const utils = (gpus || []).map((g) => g.util_pct).filter((u) => u != null);
  const mems = (gpus || []).map((g) => g.mem_used_mb).filter((m) => m != null);
  return {
    util: utils.length ? utils.reduce((a, b) => a + b, 0) / utils.length : null,
    mem: mems.length ? mems.reduce((a, b) => a + b, 0) : null,
  };
}

/** The charts section of one job's detail panel. Append `node`, then call load(). */
export class JobCharts {
  constructor(jobId) {
    this.id = jobId;
    this.curves = new JobCurves(this);
    this.charts = new Map(); // metric -> LiveChart
    this.gpu = null; // {util, mem}
    this.marks = [];
    this.seq = 0; // the last JOBS sequence folded
    this.early = []; // feed events that came while the history loads
    this.earlyBeats = [];
    this.eventsLoaded = this.gpuLoaded = this.closed = this.failed = false;
    this.lastBeat = new Map(); // worker -> time (s) of its last reading shown
    this.note = h('p', {class: 'empty'}, 'Reading the job\u2019s history\u2026');
    this.metricsBox = h('div', {class: 'charts', id: 'job-metric-charts'});
    this.recoveries = h('ul', {class: 'recoveries', id: 'job-recoveries', hidden: true});
    this.gpuNote = h('p', {class: 'empty'}, 'Reading its workers\u2019 GPU history\u2026');
    this.gpuBox = h('div', {class: 'charts', id: 'job-gpu-charts'});
    this.key = h('p', {class: 'chart-key', hidden: true}, 'Marked: ', h('span', {class: 'checkpoint'}, 'checkpoints'),
      ', ', h('span', {class: 'recovery'}, 'recoveries'), ' (a shard revoked: its worker lost, preempted\u2026), ',
      h('span', {class: 'epoch'}, 'new epochs'), ' (a shard placed again).');
    this.node = h('section', {class: 'job-charts', id: 'job-charts'},
      h('h3', {}, 'Training'), this.note, this.key, this.metricsBox, this.recoveries,
      h('h3', {}, 'GPUs'), this.gpuNote, this.gpuBox);
  }

  async load() {
    await Promise.all([this.loadEvents(), this.loadTelemetry()]);
  }

  async loadEvents() {
    let after = null;
    try {
      do {
        const page = await api(`/v1/jobs/${encodeURIComponent(this.id)}/events`, {scope: 'tenant', query: {limit: PAGE, after}});
        if (this.closed) return;
        for (const item of page.items) this.fold(item.seq, item.time, item.type, item.event);
        after = page.next || null;
      } while (after);
    } catch (error) {
      if (!this.closed) report(error);
      this.failed = true; // the curves hold what was read; reopening the job reads it all again
    } finally {
      this.eventsLoaded = true;
      for (const m of this.early.splice(0)) this.fold(m.seq, m.time, m.kind, m.event);
      if (!this.closed) {
        this.node.dataset.history = this.failed ? 'failed' : 'loaded';
        this.showNote();
      }
    }
  }

  async loadTelemetry() {
    try {
      const body = await api(`/v1/jobs/${encodeURIComponent(this.id)}/telemetry`, {scope: 'tenant', query: {points: GPU_POINTS}});
      if (this.closed) return;
      const util = {};
      const mem = {};
      for (const w of body.workers) {
        for (const s of w.samples) {
          if (s.util_pct != null) (util[w.worker_id] ??= []).push([s.time_s, s.util_pct]);
          if (s.mem_used_mb != null) (mem[w.worker_id] ??= []).push([s.time_s, s.mem_used_mb]);
          this.lastBeat.set(w.worker_id, s.time_s);
        }
      }
      if (Object.keys(util).length || Object.keys(mem).length) {
        const charts = this.gpuCharts();
        charts.util.replace(util);
        charts.mem.replace(mem);
      }
      this.workers = body.workers.length;
    } catch (error) {
      if (!this.closed) report(error);
    } finally {
      this.gpuLoaded = true;
      for (const m of this.earlyBeats.splice(0)) this.telemetry(m);
      if (!this.closed) this.showNote();
    }
  }

  showNote() {
    if (this.eventsLoaded) {
      this.note.hidden = this.charts.size > 0 && !this.failed;
      this.note.textContent = this.failed
        ? 'The job\u2019s history could not be read whole (see the banner): close and reopen the job to read it again.'
        : 'No progress reported yet: its curves appear with the first report.';
    }
    if (this.gpuLoaded) {
      this.gpuNote.hidden = this.gpu != null;
      this.gpuNote.textContent = this.workers
        ? 'No GPU readings: its workers report no GPUs, or also ran other work (their readings are the whole host\u2019s).'
        : 'No worker has held this job yet.';
    }
  }

  fold(seq, time, type, event) {
    if (this.closed || seq <= this.seq) return;
    this.seq = seq;
    this.curves.apply(type, event || {}, Date.parse(time) / 1000);
  }

  /** A feed event of this job. */
  event(m) {
    if (!this.eventsLoaded) this.early.push(m);
    else this.fold(m.seq, m.time, m.kind, m.event);
  }

  /** A feed telemetry message: drawn when its worker runs this job alone among the tenant's work. */
  telemetry(m) {
    if (this.closed || !(m.jobs || []).includes(this.id)) return;
    if (!this.gpuLoaded) {
      this.earlyBeats.push(m);
      return;
    }
    const t = Date.parse(m.time) / 1000;
    if (m.jobs.length !== 1 || !(t > (this.lastBeat.get(m.worker) ?? -Infinity))) return;
    const {util, mem} = gpuReadings(m.event?.gpus);
    if (util == null && mem == null) return;
    this.lastBeat.set(m.worker, t);
    const charts = this.gpuCharts();
    if (util != null) charts.util.push(m.worker, t, util);
    if (mem != null) charts.mem.push(m.worker, t, mem);
    this.showNote();
  }

  // -- the sink of JobCurves -----------------------------------------------------------------------

  point(metric, line, x, y) {
    this.chart(metric)?.push(line, x, y);
  }

  mark(kind, label, x, timeS) {
    this.marks.push({kind, label, x, timeS});
    for (const chart of this.charts.values()) chart.mark(x, label, kind);
    if (this.gpu) for (const chart of Object.values(this.gpu)) chart.mark(timeS, label, kind);
    if (kind !== 'checkpoint') { // recoveries and new epochs, also as text (checkpoints: marks only)
      const at = `${this.curves.axis || 'step'} ${Number(x).toLocaleString('en-US', {maximumFractionDigits: 2})}`;
      this.recoveries.append(h('li', {dataset: {kind}}, `${at}: ${label}`));
      this.recoveries.hidden = false;
    }
  }

  chart(metric) {
    let chart = this.charts.get(metric);
    if (chart) return chart;
    if (this.charts.size >= MAX_METRICS) return null;
    // a federated job's aggregated line comes first in every chart: the same colour in each
    const lines = this.curves.federated ? ['aggregated'] : [];
    chart = new LiveChart({title: metric, x: this.curves.axis || 'step', y: metric, height: 180, lines});
    this.charts.set(metric, chart);
    if (metric === 'loss') this.metricsBox.prepend(chart.node);
    else this.metricsBox.append(chart.node);
    for (const m of this.marks) chart.mark(m.x, m.label, m.kind);
    this.mount(chart);
    this.note.hidden = true;
    this.key.hidden = false;
    return chart;
  }

  gpuCharts() {
    if (this.gpu) return this.gpu;
    const pct = (v) => (v == null ? '\u2014' : `${Math.round(v)}%`);
    const mib = (v) => (v == null ? '\u2014' : fmt.mb(Math.round(v)));
    this.gpu = {
      util: new LiveChart({title: 'GPU utilisation', x: 'time', y: '%', height: 160, format: pct}),
      mem: new LiveChart({title: 'GPU memory', x: 'time', y: 'MiB', height: 160, format: mib}),
    };
    for (const chart of Object.values(this.gpu)) {
      this.gpuBox.append(chart.node);
      for (const m of this.marks) chart.mark(m.timeS, m.label, m.kind);
      this.mount(chart);
    }
    this.gpuNote.hidden = true;
    return this.gpu;
  }

  mount(chart) {
    chart.mount().then(() => {
      if (this.closed) chart.destroy();
    }, report);
  }

  destroy() {
    this.closed = true;
    for (const chart of this.charts.values()) chart.destroy();
    if (this.gpu) for (const chart of Object.values(this.gpu)) chart.destroy();
  }
}
