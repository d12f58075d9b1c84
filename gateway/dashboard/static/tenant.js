// The endpoints view (rows re-read from the API whenever the feed carries one of their events) and
// the billing view (usage and invoices; metering is not on the feed, so it is re-read every 30 s
// while shown).

import {$, badge, dash, fmt, h, listFooter, report, timeCell} from './dom.js';
import {Refresher, api} from './api.js';

const PAGE = 100;
const BILLING_EVERY_MS = 30_000;

export const endpoints = {
  rows: new Map(), // endpoint_id -> tr
  next: null,
  generation: 0,
  loading: false,
  queued: [],
  fresh: new Set(),

  init() {
    this.refresher = new Refresher(
      (id) => api(`/v1/endpoints/${encodeURIComponent(id)}`, {scope: 'tenant'}),
      (id, endpoint) => this.apply(id, endpoint),
      report,
    );
    $('endpoints-more').addEventListener('click', () => this.loadPage());
    $('endpoints-deleted').addEventListener('change', () => this.reload());
  },

  reset() {
    this.generation += 1;
    this.refresher.reset();
    this.rows.clear();
    this.fresh.clear();
    this.next = null;
    this.queued = [];
    this.loading = false;
    $('endpoints-table').tBodies[0].replaceChildren();
    $('endpoints-count').textContent = '';
    listFooter('endpoints', 1, null);
  },

  async reload() {
    this.reset();
    await this.loadPage();
  },

  async loadPage() {
    const generation = this.generation;
    this.loading = true;
    try {
      const page = await api('/v1/endpoints', {
        scope: 'tenant',
        query: {limit: PAGE, after: this.next, include_deleted: $('endpoints-deleted').checked ? 'true' : ''},
      });
      if (generation !== this.generation) return;
      for (const endpoint of page.items) if (!this.rows.has(endpoint.endpoint_id)) this.put(endpoint, false);
      this.next = page.next || null;
    } catch (error) {
      if (generation === this.generation) report(error);
    } finally {
      if (generation === this.generation) {
        this.loading = false;
        for (const m of this.queued.splice(0)) this.message(m);
        this.footer();
      }
    }
  },

  footer() {
    listFooter('endpoints', this.rows.size, this.next);
    const n = this.rows.size;
    $('endpoints-count').textContent = n ? `${n} endpoint${n === 1 ? '' : 's'}${this.next ? ', more below' : ''}` : '';
  },

  message(m) {
    if (this.loading) {
      this.queued.push(m);
      return;
    }
    if (!m.endpoint) return;
    if (!this.rows.has(m.endpoint) && m.kind === 'endpoint.deployed') this.fresh.add(m.endpoint);
    if (this.rows.has(m.endpoint) || this.fresh.has(m.endpoint)) this.refresher.request(m.endpoint);
  },

  apply(id, endpoint) {
    const tr = this.rows.get(id);
    const hidden = endpoint == null || (endpoint.state === 'deleted' && !$('endpoints-deleted').checked);
    if (hidden) {
      if (tr) tr.remove();
      this.rows.delete(id);
    } else if (tr) {
      this.render(tr, endpoint, true);
    } else if (this.fresh.has(id)) {
      this.put(endpoint, true);
    }
    this.fresh.delete(id);
    this.footer();
  },

  put(endpoint, newest) {
    const tr = h('tr', {dataset: {endpoint: endpoint.endpoint_id}});
    this.rows.set(endpoint.endpoint_id, tr);
    this.render(tr, endpoint, newest);
    const body = $('endpoints-table').tBodies[0];
    if (newest) body.prepend(tr);
    else body.append(tr);
  },

  render(tr, e, flash) {
    const hardware = [e.gpu_type || (e.vram_mb ? 'any GPU' : 'any host'), e.vram_mb ? `${fmt.mb(e.vram_mb)} VRAM` : null,
      e.engine || 'engine by host', e.pool].filter(Boolean).join(' \u00b7 ');
    tr.replaceChildren(
      h('td', {}, h('span', {}, e.name), h('span', {class: 'sub'}, e.endpoint_id)),
      h('td', {}, h('span', {}, e.model), e.model_source === 'workspace' ? h('span', {class: 'sub'}, 'from workspace') : null),
      h('td', {dataset: {col: 'state'}}, badge(e.state), e.scale_reason ? h('span', {class: 'sub'}, e.scale_reason) : null),
      h('td', {class: 'nowrap', dataset: {col: 'replicas'}}, `${e.ready_replicas}/${e.desired_replicas} ready`,
        h('span', {class: 'sub'}, `min ${e.min_replicas}, max ${e.max_replicas}`)),
      h('td', {}, e.replicas.length
        ? h('div', {class: 'chips'}, e.replicas.map((r) => h('span', {class: 'chip', title: r.address || r.reason || null},
          `${r.worker_id} \u00b7 ${r.state}`)))
        : dash),
      h('td', {}, hardware),
      timeCell(e.deployed_at),
    );
    if (flash) {
      tr.classList.remove('updated');
      void tr.offsetWidth;
      tr.classList.add('updated');
    }
  },
};

export const billing = {
  generation: 0,
  timer: null,
  invoice: null, // the open invoice's period

  init() {
    $('billing-refresh').addEventListener('click', () => this.load());
  },

  shown() {
    this.load();
    clearInterval(this.timer);
    this.timer = setInterval(() => this.load(), BILLING_EVERY_MS);
  },

  hidden() {
    clearInterval(this.timer);
    this.timer = null;
  },

  reset() {
    this.generation += 1;
    this.invoice = null;
    $('usage-table').tBodies[0].replaceChildren();
    $('invoices-table').tBodies[0].replaceChildren();
    $('invoice-detail').hidden = true;
    $('billing-total').textContent = '';
  },

  async load() {
    const generation = this.generation;
    try {
      const [usage, invoices] = await Promise.all([
        api('/v1/billing/usage', {scope: 'tenant'}),
        api('/v1/billing/invoices', {scope: 'tenant'}),
      ]);
      if (generation !== this.generation) return;
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
        h('td', {class: 'mono', title: l.source_seqs.join(', ')}, seqRange(l.source_seqs)))));
      $('invoice-detail').hidden = false;
    } catch (error) {
      if (generation === this.generation) report(error);
    }
  },
};

/** Metering sequences, shortened: "12, 15, 19" or "12 \u2026 480 (47)". */
function seqRange(seqs) {
  if (seqs.length <= 4) return seqs.join(', ');
  return `${seqs[0]} \u2026 ${seqs[seqs.length - 1]} (${seqs.length})`;
}
