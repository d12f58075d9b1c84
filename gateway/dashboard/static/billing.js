// The billing view: spend per day (series.js), usage and invoices (metering is not on the feed, so
// it is re-read every 30 s while shown).

import {$, badge, fmt, h, polling, report} from './dom.js';
import {api} from './api.js';
import {spend} from './series.js';

const BILLING_EVERY_MS = 30_000;

export const billing = {
  ...polling(BILLING_EVERY_MS),
  generation: 0,
  invoice: null, // the open invoice's period

  init() {
    $('billing-refresh').addEventListener('click', () => this.load());
  },

  poll() {
    this.load();
  },

  reset() {
    this.generation += 1;
    this.invoice = null;
    $('usage-table').tBodies[0].replaceChildren();
    $('invoices-table').tBodies[0].replaceChildren();
    $('invoice-detail').hidden = true;
    $('billing-total').textContent = '';
    spend.clear();
  },

  async load() {
    const generation = this.generation;
    try {
      const [usage, invoices, daily] = await Promise.all([
        api('/v1/billing/usage', {scope: 'tenant'}),
        api('/v1/billing/invoices', {scope: 'tenant'}),
        api('/v1/billing/usage/daily', {scope: 'tenant'}),
      ]);
      if (generation !== this.generation) return;
      spend.show(daily);
      this.showUsage(usage);
      this.showInvoices(invoices);
      if (this.invoice) await this.open(this.invoice);
    } catch (error) {
      if (generation === this.generation) report(error);
    }
  },

  showUsage(usage) {
    $('billing-total').textContent = `Charges to date: ${fmt.money(usage.total)}`;
    const rows = [];
    for (const period of usage.periods) {
      for (const w of period.work) {
        rows.push(h('tr', {},
          h('td', {}, period.period), h('td', {}, h('span', {}, w.work_id), h('span', {class: 'sub'}, w.work_kind)),
          h('td', {class: 'num'}, fmt.hours(w.gpu_seconds)), h('td', {class: 'num'}, fmt.hours(w.cpu_seconds)),
          h('td', {class: 'num'}, fmt.int(w.tokens)), h('td', {class: 'num'}, fmt.money(w.charge))));
      }
      rows.push(h('tr', {class: 'total'},
        h('td', {}, h('strong', {}, period.period)), h('td', {}, h('strong', {}, 'total')),
        h('td', {class: 'num'}, fmt.hours(period.gpu_seconds)), h('td', {class: 'num'}, fmt.hours(period.cpu_seconds)),
        h('td', {}), h('td', {class: 'num'}, h('strong', {}, fmt.money(period.charge)))));
    }
    $('usage-table').tBodies[0].replaceChildren(...rows);
    $('usage-empty').hidden = rows.length > 0;
  },

  showInvoices(invoices) {
    $('invoices-table').tBodies[0].replaceChildren(...invoices.map((inv) => {
      const tr = h('tr', {class: 'pick', tabindex: 0, dataset: {period: inv.period}},
        h('td', {}, inv.period), h('td', {}, badge(inv.open ? 'open' : 'closed')),
        h('td', {class: 'num'}, inv.lines), h('td', {class: 'num'}, fmt.money(inv.total)));
      tr.classList.toggle('selected', inv.period === this.invoice);
      tr.addEventListener('click', () => this.open(inv.period));
      tr.addEventListener('keydown', (e) => e.key === 'Enter' && this.open(inv.period));
      return tr;
    }));
    $('invoices-empty').hidden = invoices.length > 0;
  },

  async open(period) {
    const generation = this.generation;
    this.invoice = period;
    for (const tr of $('invoices-table').tBodies[0].rows) tr.classList.toggle('selected', tr.dataset.period === period);
    try {
      const inv = await api(`/v1/billing/invoices/${encodeURIComponent(period)}`, {scope: 'tenant'});
      if (generation !== this.generation || this.invoice !== period) return;
      $('invoice-title').textContent = `Invoice ${inv.period} (${inv.open ? 'open: the month is not over' : 'closed'}): ${fmt.money(inv.total)}`;
      $('invoice-lines').tBodies[0].replaceChildren(...inv.lines.map((l) => h('tr', {},
        h('td', {}, h('span', {}, l.work_id), h('span', {class: 'sub'}, l.work_kind)), h('td', {}, l.gpu_type), h('td', {}, l.pool),
        h('td', {class: 'num'}, l.price_version), h('td', {class: 'num'}, fmt.hours(l.gpu_seconds)),
        h('td', {class: 'num'}, fmt.hours(l.cpu_seconds)), h('td', {class: 'num'}, fmt.int(l.tokens)),
        h('td', {class: 'num'}, fmt.int(l.ticks)), h('td', {class: 'num'}, fmt.money(l.charge)),
        h('td', {class: 'mono', title: seqRanges(l.source_ranges)}, seqRange(l.source_ranges)))));
      $('invoice-detail').hidden = false;
    } catch (error) {
      if (generation === this.generation) report(error);
    }
  },
};

/** An invoice line's ranges of metering sequences (inclusive runs): "12\u201315, 19". */
function seqRanges(ranges) {
  return ranges.map(([first, last]) => (first === last ? `${first}` : `${first}\u2013${last}`)).join(', ');
}

/** The same, shortened: "12\u201315, 19" or "12 \u2026 480 (7 ranges)". */
function seqRange(ranges) {
  if (ranges.length <= 3) return seqRanges(ranges);
  return `${ranges[0][0]} \u2026 ${ranges[ranges.length - 1][1]} (${ranges.length} ranges)`;
}
