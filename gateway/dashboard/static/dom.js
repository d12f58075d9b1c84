// DOM helpers, formatting and the error banner.
//
// Every node is built with h(), which inserts strings as text nodes: API data is never parsed as
// HTML, so a job named "<img onerror=...>" shows as those characters. Nothing here sets innerHTML.

export const $ = (id) => document.getElementById(id);

/** An element with attributes (on* keys add listeners; class, dataset) and children (strings become
 * text nodes; null, undefined and false are skipped). */
export function h(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (value == null || value === false) continue;
    if (name === 'class') node.className = value;
    else if (name === 'dataset') Object.assign(node.dataset, value);
    else if (name.startsWith('on')) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? '' : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child == null || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/** The shown() and hidden() of a view re-read every `everyMs` while it is shown (spread it into the
 * view): its first() when shown (default: its poll()), then its poll() every `everyMs` until hidden. */
export function polling(everyMs) {
  return {
    timer: null,
    shown() {
      (this.first || this.poll).call(this);
      clearInterval(this.timer);
      this.timer = setInterval(() => this.poll(), everyMs);
    },
    hidden() {
      clearInterval(this.timer);
      this.timer = null;
    },
  };
}

export const badge = (state) => h('span', {class: `state ${state}`}, state);
export const dash = '\u2014';

export const fmt = {
  /** ISO 8601 as local time; the full timestamp is the cell's title. */
  time(iso) {
    if (!iso) return dash;
    const when = new Date(iso);
    const today = new Date().toDateString() === when.toDateString();
    return today ? when.toLocaleTimeString() : when.toLocaleString();
  },
  loss: (x) => (x == null ? dash : Number(x).toPrecision(4)),
  pct: (x) => (x == null ? dash : `${Math.round(x)}%`),
  hours: (seconds) => (seconds / 3600).toFixed(seconds < 36 ? 4 : 2),
  int: (x) => (x == null ? dash : Number(x).toLocaleString('en-US')),
  /** Per second: two decimals below 10, one below 100. */
  rate: (x) => (x < 10 ? x.toFixed(2) : x < 100 ? x.toFixed(1) : Math.round(x).toLocaleString('en-US')),
  /** A fraction as a percentage with one decimal ("0%" when none). */
  share: (x) => (x ? `${(x * 100).toFixed(1)}%` : '0%'),
  /** Milliseconds: one decimal below 10 ms, whole below a second, then seconds. */
  ms: (x) => (x < 10 ? `${x.toFixed(1)} ms` : x < 1000 ? `${Math.round(x)} ms` : `${(x / 1000).toFixed(2)} s`),
  mb: (x) => (x == null ? dash : x >= 1024 ? `${(x / 1024).toFixed(1)} GiB` : `${x} MiB`),
  /** {micros, usd}: dollars with at least two decimals, trailing zeros dropped (exact: the API's
   * decimal string, never a float). */
  money(m) {
    if (!m) return dash;
    let [whole, cents = ''] = m.usd.split('.');
    cents = cents.replace(/0+$/, '').padEnd(2, '0');
    const sign = whole.startsWith('-') ? '-' : '';
    whole = Number(whole.replace('-', '')).toLocaleString('en-US');
    return `${sign}$${whole}.${cents}`;
  },
  ago(seconds) {
    if (seconds == null) return 'never';
    if (seconds < 90) return `${Math.round(seconds)} s ago`;
    if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
    return `${Math.round(seconds / 3600)} h ago`;
  },
};

/** A table cell showing a time, with the exact timestamp as its title. */
export const timeCell = (iso) => h('td', {class: 'nowrap', title: iso || null}, fmt.time(iso));

/** The visible error banner: the API's {"error": {"code", "message"}}, or a network failure. */
export const banner = {
  show(error) {
    $('banner-code').textContent = error.code || 'error';
    $('banner-text').textContent = error.message || String(error);
    $('banner').hidden = false;
  },
  clear() {
    $('banner').hidden = true;
  },
};

export function report(error) {
  console.error(error);
  banner.show(error);
}

/** Show the table's empty note when it has no rows, and the "load more" button while there is more. */
export function listFooter(name, rows, next) {
  $(`${name}-empty`).hidden = rows > 0;
  const more = $(`${name}-more`);
  if (more) more.hidden = !next;
}
