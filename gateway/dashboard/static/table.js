// Tables, once: the live list that a view's main table is (jobs, endpoints), and the small tables of
// the detail panels.
//
// A LiveList reads pages from the API (newest first, through its cursor), keeps one row per id, and
// keeps the rows current: a feed message that says an item changed re-reads that item (api.js's
// Refresher), and refreshShown() re-reads the pages shown, for figures the feed does not carry.
// Messages that arrive while a page loads wait for it, so that none falls between list and feed. The
// view renders a row's cells; the list owns the rows, the paging and the footer. Its elements are
// named after the view: #NAME-table, #NAME-empty, #NAME-more and #NAME-count.

import {$, fmt, h, listFooter} from './dom.js';
import {Refresher} from './api.js';

/** Highlight a row that changed live (restarting the highlight if it is still running). */
export function flash(tr) {
  tr.classList.remove('updated');
  void tr.offsetWidth; // restart the animation
  tr.classList.add('updated');
}

/** A small table: headings, then one row per entry of `rows` (a list of cells: text, nodes, or a
 * ready h('td') when the cell needs attributes). props go on the table (id, ...). */
export function miniTable(headings, rows, props = {}) {
  const cell = (c) => (c instanceof HTMLTableCellElement ? c : h('td', {}, c));
  return h('table', {...props, class: 'mini'},
    h('thead', {}, h('tr', {}, headings.map((t) => h('th', {}, t)))),
    h('tbody', {}, rows.map((cells) => h('tr', {}, cells.map(cell)))));
}

/** What a view whose main table is a LiveList (its `list`) does with it (spread it into the view;
 * a view that keeps more than its list resets that too in its own reset()). */
export const listView = {
  reset() {
    this.list.reset();
  },

  async reload() {
    this.reset();
    await this.list.loadPage();
  },

  /** A message of the feed (the list holds it back while a page loads). */
  message(m) {
    this.list.message(m);
  },
};

export class LiveList {
  /**
   * @param {object} o
   * @param {string} o.name the view's name (the prefix of its element ids)
   * @param {string} o.noun what a row is, for the count ("job": "3 jobs shown")
   * @param {(item) => string} o.key an item's id
   * @param {(after, limit) => Promise<{items, next}>} o.page one page of the list, filters applied
   * @param {(id) => Promise<object>} o.one one item (a 404 means it is gone)
   * @param {(item, tr) => void} o.render fill a row's cells
   * @param {(m) => void} o.handle the view's reaction to a feed message (once no page is loading)
   * @param {(error) => void} o.onError
   * @param {(item) => boolean} [o.keeps] whether an item belongs in the list (the view's filter)
   * @param {(id) => void} [o.pick] rows are clickable and open this
   * @param {(id, item) => void} [o.applied] told of every item applied (null: gone)
   * @param {string} [o.attr] the row's data attribute naming its id (default: the noun)
   * @param {number} [o.pageSize] rows per page (default 100)
   */
  constructor(o) {
    this.o = {keeps: () => true, attr: o.noun, pageSize: 100, ...o};
    this.rows = new Map(); // id -> {item, tr, changed}
    this.fresh = new Set(); // announced as new by the feed, not yet read
    this.queued = [];
    this.next = null;
    this.loading = false;
    this.generation = 0;
    this.selected = null; // the id whose row is highlighted as open
    this.refreshing = false;
    this.refresher = new Refresher(o.one, (id, item) => this.apply(id, item), o.onError);
  }

  get tbody() {
    return $(`${this.o.name}-table`).tBodies[0];
  }

  reset() {
    this.generation += 1;
    this.refresher.reset();
    this.rows.clear();
    this.fresh.clear();
    this.queued = [];
    this.next = null;
    this.loading = false;
    this.selected = null;
    this.tbody.replaceChildren();
    $(`${this.o.name}-count`).textContent = '';
    listFooter(this.o.name, 1, null);
  }

  async reload() {
    this.reset();
    await this.loadPage();
  }

  /** The next page, below the rows shown. */
  async loadPage() {
    const generation = this.generation;
    const more = $(`${this.o.name}-more`);
    this.loading = true;
    more.disabled = true;
    try {
      const page = await this.o.page(this.next, this.o.pageSize);
      if (generation !== this.generation) return;
      for (const item of page.items) if (!this.rows.has(this.o.key(item))) this.put(item, false);
      this.next = page.next || null;
    } catch (error) {
      if (generation === this.generation) this.o.onError(error);
    } finally {
      if (generation === this.generation) {
        this.loading = false;
        more.disabled = false;
        for (const m of this.queued.splice(0)) this.o.handle(m);
        this.footer();
      }
    }
  }

  /**
   * Re-read the rows shown (page after page from the top until they are covered, limit per page),
   * quietly: no highlight. A row the feed announced as changed after this read began keeps what its
   * own read brings, which is newer.
   */
  async refreshShown(limit) {
    if (this.loading || this.refreshing || !this.rows.size) return; // one re-read at a time
    this.refreshing = true;
    try {
      await this.reread(limit);
    } finally {
      this.refreshing = false;
    }
  }

  async reread(limit) {
    const generation = this.generation;
    const began = performance.now();
    const found = new Map();
    let after = null;
    let covered = 0;
    try {
      do {
        const page = await this.o.page(after, limit);
        if (generation !== this.generation) return;
        for (const item of page.items) {
          found.set(this.o.key(item), item);
          if (this.rows.has(this.o.key(item))) covered += 1;
        }
        after = page.next;
      } while (after && covered < this.rows.size);
    } catch (error) {
      if (generation === this.generation) this.o.onError(error);
      return;
    }
    for (const [id, row] of this.rows) {
      const item = found.get(id);
      if (item && row.changed < began && !this.refresher.busy(id) && this.o.keeps(item)) {
        row.item = item;
        this.draw(row);
      }
    }
  }

  footer() {
    listFooter(this.o.name, this.rows.size, this.next);
    const n = this.rows.size;
    $(`${this.o.name}-count`).textContent =
      n ? `${fmt.int(n)} ${this.o.noun}${n === 1 ? '' : 's'} shown${this.next ? ', more below' : ''}` : '';
  }

  /** A feed message: handled by the view now, or once the page being read is in. */
  message(m) {
    if (this.loading) this.queued.push(m);
    else this.o.handle(m);
  }

  /** Whether the list shows the item, or is about to (announced new). */
  has(id) {
    return this.rows.has(id) || this.fresh.has(id);
  }

  busy(id) {
    return this.refresher.busy(id);
  }

  /** The feed says the item changed (created: it is new, and goes on top): read it again. */
  changed(id, created = false) {
    if (created && !this.rows.has(id)) this.fresh.add(id);
    const row = this.rows.get(id);
    if (row) row.changed = performance.now();
    this.refresher.request(id);
  }

  /** The item as it is now (from the API, or folded from an event by the view); null when gone. */
  apply(id, item) {
    const row = this.rows.get(id);
    if (item == null || !this.o.keeps(item)) {
      if (row) {
        row.tr.remove();
        this.rows.delete(id);
      }
    } else if (row) {
      row.item = item;
      this.draw(row);
      flash(row.tr);
    } else if (this.fresh.has(id)) {
      this.put(item, true);
    }
    this.fresh.delete(id);
    this.footer();
    this.o.applied?.(id, item);
  }

  /** Render a row again from what it holds (no highlight). */
  redraw(id) {
    const row = this.rows.get(id);
    if (row) this.draw(row);
  }

  /** Mark the row of the open item (null: none). */
  select(id) {
    this.selected = id;
    for (const [rowId, row] of this.rows) row.tr.classList.toggle('selected', rowId === id);
  }

  draw(row) {
    this.o.render(row.item, row.tr);
    row.tr.classList.toggle('selected', this.o.key(row.item) === this.selected);
  }

  item(id) {
    return this.rows.get(id)?.item;
  }

  *items() {
    for (const row of this.rows.values()) yield row.item;
  }

  put(item, newest) {
    const id = this.o.key(item);
    const pick = this.o.pick;
    const tr = h('tr', {class: pick ? 'pick' : null, tabindex: pick ? 0 : null, dataset: {[this.o.attr]: id}});
    if (pick) {
      tr.addEventListener('click', () => pick(id));
      tr.addEventListener('keydown', (e) => e.key === 'Enter' && pick(id));
    }
    const row = {item, tr, changed: 0};
    this.rows.set(id, row);
    this.draw(row);
    if (newest) {
      this.tbody.prepend(tr);
      flash(tr);
    } else {
      this.tbody.append(tr);
    }
  }
}
