// Charts of money and machines over time: a tenant's spend per day (the Billing view), a provider's
// earnings per day and tier and its nodes' uptime per day (the Payouts view), and the operator's
// Fleet view: the share of registered GPUs that work held, and what the agents reported of their
// GPUs' utilisation, in 5-minute buckets.
//
// Every figure is the API's (gateway/routes/series.py): the ledger's money per UTC day, the
// registry's downtime per day, the kernel's metering and the agents' heartbeats per bucket. The
// views re-read them with their tables (billing every 30 s, payouts every 30 s, fleet every 30 s)
// and each chart is redrawn whole from the answer (LiveChart.replace): a day's figure can still
// grow while its ticks arrive.

import {$, fmt, polling, report} from './dom.js';
import {api} from './api.js';
import {LiveChart} from './charts.js';

const FLEET_EVERY_MS = 30_000;
const daySeconds = (day) => Date.parse(`${day}T00:00:00Z`) / 1000;
const dollars = (money) => money.micros / 1e6;
const usd = (v) => (v == null ? '\u2014' : `$${v < 1 && v !== 0 ? v.toFixed(6) : v.toFixed(2)}`);
const pct = (v) => (v == null ? '\u2014' : `${v.toFixed(1)}%`);
/** Points drawn on a line of few figures (a fleet whose history is a bucket or two), not on a day's. */
const few = (u, line) => u.data[line].reduce((n, v) => n + (v != null), 0) <= 48;

/** A chart in the element `hostId`, made on its first figures and redrawn whole with each answer. */
class ChartSlot {
  constructor(hostId, options) {
    this.hostId = hostId;
    this.options = options;
    this.chart = null;
  }

  /** Draw {label: [[x, y], ...]} (the plot is built once uPlot has loaded, with these figures). */
  show(lines) {
    if (!this.chart) {
      this.chart = new LiveChart(this.options);
      $(this.hostId).replaceChildren(this.chart.node);
      this.chart.mount();
    }
    this.chart.replace(lines);
  }

  clear() {
    this.chart?.destroy();
    this.chart = null;
    $(this.hostId).replaceChildren();
  }
}

/** The Billing view's chart: what the tenant was charged per UTC day, the last 30 days. */
export const spend = {
  slot: new ChartSlot('billing-chart', {title: 'Spend per day', x: 'time', y: 'USD', height: 200, format: usd, points: true, lines: ['spend']}),

  show(daily) {
    this.slot.show({spend: daily.days.map((d) => [daySeconds(d.day), dollars(d.spend)])});
    $('billing-chart-note').textContent = `${fmt.money(daily.total)} from ${daily.first_day} to ${daily.last_day} ` +
      '(UTC days; a day is billed with the usage that ended in it)';
  },

  clear() {
    this.slot.clear();
    $('billing-chart-note').textContent = '';
  },
};

/** The Payouts view's charts: earnings per day (in all and per tier) and each node's uptime per day. */
export const earnings = {
  money: new ChartSlot('payouts-earnings-chart', {title: 'Earnings per day', x: 'time', y: 'USD', height: 200, format: usd, points: true, lines: ['total']}),
  uptime: new ChartSlot('payouts-uptime-chart', {title: 'Node uptime per day', x: 'time', y: '% of the day', height: 200, format: pct, points: true}),

  show(daily) {
    const lines = {total: daily.days.map((d) => [daySeconds(d.day), dollars(d.total)])};
    for (const tier of daily.tiers) {
      lines[tier] = daily.days.map((d) => {
        const paid = d.tiers.find((t) => t.tier === tier);
        return [daySeconds(d.day), paid ? dollars(paid.payout) : 0];
      });
    }
    this.money.show(lines);
    const nodes = {};
    for (const node of daily.nodes) {
      // every day of the window (null where the node was not observed): the axis spans the window
      nodes[node.worker_id] = node.days.map((d) => [daySeconds(d.day), d.uptime == null ? null : d.uptime * 100]);
    }
    this.uptime.show(nodes);
    $('payouts-chart-note').textContent = `${fmt.money(daily.total)} from ${daily.first_day} to ${daily.last_day}` +
      `${daily.tiers.length ? ` (tiers: ${daily.tiers.join(', ')})` : ''}; uptime: the share of each UTC day a node ` +
      'was registered and not lost, as the kernel saw it';
  },

  clear() {
    this.money.clear();
    this.uptime.clear();
    $('payouts-chart-note').textContent = '';
  },
};

/** The operator's Fleet view: GPU utilisation over the last hours, refreshed every 30 s while shown. */
export const fleet = {
  ...polling(FLEET_EVERY_MS),
  generation: 0,
  slot: new ChartSlot('fleet-chart', {
    title: 'Fleet GPU utilisation', x: 'time', y: '%', height: 260, format: pct, points: few,
    lines: ['allocated (kernel)', "measured (agents' report)"],
  }),

  init() {
    $('fleet-hours').addEventListener('change', () => this.poll());
  },

  reset() {
    this.generation += 1;
    this.slot.clear();
    $('fleet-now').textContent = '';
  },

  async poll() {
    const generation = ++this.generation;
    try {
      const body = await api('/v1/fleet/utilisation', {query: {hours: $('fleet-hours').value}});
      if (generation !== this.generation) return;
      const at = (b) => Date.parse(b.at) / 1000;
      // every bucket of the window, null where there is no figure: the axis spans the window
      this.slot.show({
        'allocated (kernel)': body.buckets.map((b) => [at(b), b.allocated == null ? null : b.allocated * 100]),
        "measured (agents' report)": body.buckets.map((b) => [at(b), b.reported_util_pct]),
      });
      const now = body.now;
      $('fleet-now').textContent = now.registered_gpus
        ? `Now: ${now.allocated_gpus} of ${now.registered_gpus} GPUs allocated (${fmt.share(now.allocated)})`
        : 'Now: no GPU registered';
    } catch (error) {
      if (generation === this.generation) report(error);
    }
  },
};
