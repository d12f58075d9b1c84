// The workers view (a provider's nodes; the operator's whole fleet) and the payouts view (with its
// charts of earnings and uptime per day, series.js).
//
// The feed carries tenant events only (a provider key is refused with 4403), so these views are
// re-read while shown (workers every 10 s, payouts every 30 s); the indicator says "polling" for a
// provider.

import {$, badge, dash, fmt, h, listFooter, polling, report} from './dom.js';
import {api, session} from './api.js';
import {miniTable} from './table.js';
import {earnings} from './series.js';

const PAGE = 100;
const MAX_PAGE = 500;
const WORKERS_EVERY_MS = 10_000;
const PAYOUTS_EVERY_MS = 30_000;

export const workers = {
  rows: new Map(), // worker_id -> tr
  next: null,
  generation: 0,
  selected: null,
  ...polling(WORKERS_EVERY_MS),

  init() {
    $('workers-more').addEventListener('click', () => this.load(false));
    $('workers-state').addEventListener('change', () => {
      this.reset();
      this.load(false);
    });
  },

  first() {
    if (!this.rows.size) this.load(false);
  },

  reset() {
    this.generation += 1;
    this.rows.clear();
    this.next = null;
    this.selected = null;
    $('workers-table').tBodies[0].replaceChildren();
    $('worker-detail').hidden = true;
    $('workers-count').textContent = '';
  },

  /** The next page (false), or the pages already shown again (true: the periodic refresh). */
  async load(again) {
    const generation = this.generation;
    const limit = again ? Math.min(MAX_PAGE, Math.max(PAGE, this.rows.size)) : PAGE;
    try {
      const page = await api('/v1/workers', {
        query: {limit, after: again ? null : this.next, state: $('workers-state').value},
      });
      if (generation !== this.generation) return;
      for (const w of page.items) this.put(w);
      if (!again || !this.rows.size) this.next = page.next || null;
      this.footer();
    } catch (error) {
      if (generation === this.generation) report(error);
    }
  },

  poll() {
    this.load(true);
    if (this.selected) this.open(this.selected);
  },

  footer() {
    listFooter('workers', this.rows.size, this.next);
    const online = [...this.rows.values()].filter((tr) => tr.dataset.online === 'true').length;
    const n = this.rows.size;
    $('workers-count').textContent = n ? `${n} worker${n === 1 ? '' : 's'}, ${online} online` : '';
  },

  put(w) {
    let tr = this.rows.get(w.worker_id);
    if (!tr) {
      tr = h('tr', {class: 'pick', tabindex: 0, dataset: {worker: w.worker_id}});
      tr.addEventListener('click', () => this.open(w.worker_id));
      tr.addEventListener('keydown', (e) => e.key === 'Enter' && this.open(w.worker_id));
      this.rows.set(w.worker_id, tr);
      $('workers-table').tBodies[0].append(tr);
    }
    tr.dataset.online = String(w.online);
    const gpus = w.gpus.length ? `${w.gpus.length} \u00d7 ${w.gpus[0].model}` : `CPU only, ${w.cpus} cores`;
    tr.replaceChildren(
      h('td', {}, h('span', {class: 'mono'}, w.worker_id), h('span', {class: 'sub'}, `${w.hostname} \u00b7 ${w.region || 'no region'}`)),
      h('td', {class: 'nowrap', dataset: {col: 'state'}}, badge(w.state), ' ', badge(w.online ? 'online' : 'offline')),
      h('td', {class: 'tier'}, w.tier),
      h('td', {class: 'num'}, `${(w.uptime_30d * 100).toFixed(1)}%`),
      h('td', {}, gpus),
      h('td', {}, w.work.length ? h('div', {class: 'chips'}, w.work.map((x) => h('span', {class: 'chip'}, `${x.work_id} \u00b7 ${x.state}`))) : 'idle'),
      h('td', {class: 'num', dataset: {col: 'earnings'}}, fmt.money(w.earnings.payout)),
      h('td', {title: w.last_heartbeat_at || null}, fmt.ago(w.silent_s)),
    );
    tr.classList.toggle('selected', this.selected === w.worker_id);
  },

  async open(id) {
    const generation = this.generation;
    this.selected = id;
    for (const tr of this.rows.values()) tr.classList.toggle('selected', tr.dataset.worker === id);
    try {
      const w = await api(`/v1/workers/${encodeURIComponent(id)}`);
      if (generation !== this.generation || this.selected !== id) return;
      this.showDetail(w);
    } catch (error) {
      if (generation === this.generation) report(error);
    }
  },

  showDetail(w) {
    const t = w.telemetry;
    const close = h('button', {class: 'quiet', type: 'button', 'aria-label': 'close'}, '\u00d7');
    close.addEventListener('click', () => {
      this.selected = null;
      $('worker-detail').hidden = true;
      for (const tr of this.rows.values()) tr.classList.remove('selected');
    });
    const kv = (name, value) => [h('dt', {}, name), h('dd', {}, value)];
    const model = new Map(w.gpus.map((g) => [g.index, g]));
    const parts = [
      h('header', {}, h('h2', {}, w.worker_id, ' ', badge(w.online ? 'online' : 'offline')), close),
      h('dl', {class: 'kv'},
        kv('Host', `${w.hostname} (${w.region || 'no region'}, ${w.pool} pool)`),
        kv('State', w.cordon_reason ? `${w.state}: ${w.cordon_reason}` : w.state),
        kv('Tier', `${w.tier}, ${(w.uptime_30d * 100).toFixed(2)}% up over 30 days, lost ${w.lost_count} times`),
        kv('Hardware', `${w.cpus} cores, ${fmt.mb(w.memory_mb)}${w.driver ? `, driver ${w.driver}` : ''}`),
        kv('Agent', w.agent_version || dash),
        kv('Sandbox', w.sandbox_problem ? `unavailable: ${w.sandbox_problem}` : (w.sandbox || dash)),
        kv('Earnings', `${fmt.money(w.earnings.payout)} for ${fmt.hours(w.earnings.gpu_seconds)} GPU-hours, ` +
          `${fmt.hours(w.earnings.cpu_seconds)} CPU-hours`),
        kv('Heartbeat', t ? `${fmt.ago(w.silent_s)} (every ${t.interval_s} s): CPU ${fmt.pct(t.cpu_pct)}, ` +
          `memory ${fmt.mb(t.memory_used_mb)}` : 'never')),
    ];
    if (t?.gpus.length) {
      parts.push(h('h3', {}, 'GPUs'), miniTable(['GPU', 'Util', 'Memory', 'Temp', 'Power', 'ECC', 'Xid'],
        t.gpus.map((g) => [
          `${g.index} ${model.get(g.index)?.model || ''}`, h('td', {dataset: {col: 'util'}}, fmt.pct(g.util_pct)),
          `${fmt.mb(g.mem_used_mb)} / ${fmt.mb(model.get(g.index)?.vram_total_mb)}`,
          g.temp_c == null ? dash : `${g.temp_c} \u00b0C`, g.power_w == null ? dash : `${g.power_w} W`,
          g.ecc_errors ?? dash, g.xid_errors ?? dash]),
        {id: 'worker-gpus'}));
    }
    if (w.work.length) {
      parts.push(h('h3', {}, 'Work'), miniTable(['Work', 'Kind', 'Slot', 'GPUs', 'State'],
        w.work.map((x) => [[h('code', {}, x.work_id), x.tenant ? h('span', {class: 'sub'}, x.tenant) : null],
          x.kind, x.slot, x.gpus, x.state])));
    }
    $('worker-detail').replaceChildren(...parts);
    $('worker-detail').hidden = false;
  },
};

export const payouts = {
  generation: 0,
  ...polling(PAYOUTS_EVERY_MS),

  init() {
    $('payouts-refresh').addEventListener('click', () => this.load());
    $('payouts-provider').addEventListener('change', () => this.load());
  },

  first() {
    $('payouts-provider-pick').hidden = !session.operator;
    this.load();
  },

  poll() {
    this.load();
  },

  reset() {
    this.generation += 1;
    $('payouts-table').tBodies[0].replaceChildren();
    $('payouts-total').textContent = '';
    earnings.clear();
  },

  async load() {
    const provider = $('payouts-provider').value.trim();
    if (session.operator && !provider) {
      this.reset();
      $('payouts-empty').textContent = 'Enter a provider id to see its payouts.';
      $('payouts-empty').hidden = false;
      return;
    }
    const generation = ++this.generation;
    try {
      const query = {provider: session.operator ? provider : ''};
      const [body, daily] = await Promise.all([
        api('/v1/billing/payouts', {query}),
        api('/v1/billing/payouts/daily', {query}),
      ]);
      if (generation !== this.generation) return;
      earnings.show(daily);
      $('payouts-total').textContent = `Payouts to date for ${body.provider}: ${fmt.money(body.total)}`;
      const rows = body.periods.flatMap((p) => p.tiers.map((t) => h('tr', {},
        h('td', {}, p.period), h('td', {class: 'tier'}, t.tier), h('td', {class: 'num'}, fmt.hours(t.gpu_seconds)),
        h('td', {class: 'num'}, fmt.hours(t.cpu_seconds)), h('td', {class: 'num'}, fmt.int(t.ticks)),
        h('td', {class: 'num'}, fmt.money(t.payout)))));
      $('payouts-table').tBodies[0].replaceChildren(...rows);
      $('payouts-empty').textContent = 'No payouts yet.';
      $('payouts-empty').hidden = rows.length > 0;
    } catch (error) {
      if (generation === this.generation) report(error);
    }
  },
};
