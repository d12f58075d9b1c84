// Live line charts on uPlot (installed from the npm registry by `make`: ops/web.sh).
//
// A LiveChart is one uPlot plot whose lines grow point by point: every line shares one x axis (a
// step, a round, a time), as uPlot's aligned data wants, so a point at an x the chart has not seen
// adds a column (null in every other line; lines span the gaps). Points arrive one by one from the
// feed, or by the thousand from a page of history; either way they are only stored, and the plot is
// redrawn at most once per animation frame. Markers (a checkpoint, a lost worker) are vertical lines
// drawn on the plot's canvas with a short label.
//
// What keeps 64 lines of 10,000 points fast (measured in Chromium on this project's 2-core test
// machine, which rasterises in software: tests/e2e/dashboard/test_charts.py): lines 1 px wide
// (a fractional width made every redraw 5 times slower), and the plot is given at most about one
// point per pixel of its width and line: each bucket of a power-of-two number of columns is drawn
// as its mean, at its last x. Every point is kept; zooming in (drag across the plot; double-click
// to zoom out) draws the visible columns at their own finer resolution.
//
// uPlot is loaded with a dynamic import: a gateway whose files lack it (`make web` not run) still
// serves every table, and a chart shows why it is missing instead of breaking the page.

import {h} from './dom.js';

let loading = null;

/** uPlot's class, or null (with the reason logged) when ./uplot.js is not served. */
export function loadUplot() {
  loading ??= import('./uplot.js').then(
    (module) => module.default,
    (error) => {
      console.error('charts unavailable: /ui/uplot.js did not load (run `make web`)', error);
      return null;
    },
  );
  return loading;
}

/** A colour per line: distinct for the first 12, then around the hue circle. */
export function colour(i) {
  const first = ['#2f5bd3', '#c0392b', '#12805c', '#b25e09', '#7b3fb8', '#0f8a9d',
    '#a23b72', '#5b6b00', '#d35400', '#34495e', '#8e44ad', '#16a085'];
  return i < first.length ? first[i] : `hsl(${(i * 137.508) % 360}, 55%, 45%)`;
}

const MARK_COLOURS = {checkpoint: '#12805c', recovery: '#c0392b', epoch: '#667085', scale: '#b25e09'};

/**
 * One live chart.
 *
 * Options: title; x: 'time' (x in Unix seconds) or a label ('step', 'round'); y: the y axis label;
 * height (px); format(y): how a value shows in the legend; lines: labels of the first lines;
 * points: true (or uPlot's (u, line) => boolean) to draw points too, so that a lone point shows.
 */
export class LiveChart {
  constructor(options) {
    this.options = options;
    this.labels = [];
    this.index = new Map(); // label -> line number (from 1)
    this.xs = []; // ascending
    this.ys = []; // per line, aligned with xs
    this.at = new Map(); // x -> column
    this.marks = [];
    this.plot = null;
    this.frame = 0;
    this.points = 0;
    this.node = h('figure', {class: 'chart', dataset: {chart: options.title}},
      h('figcaption', {}, options.title));
    for (const label of options.lines || []) this.line(label);
  }

  /** Build the plot inside this.node (once it is in the page, so that it knows its width). */
  async mount() {
    const uPlot = await loadUplot();
    if (!uPlot) {
      this.node.append(h('p', {class: 'empty'}, 'Charts are unavailable: this gateway lacks its charting library (run make web).'));
      return this;
    }
    if (this.plot) return this;
    this.uPlot = uPlot;
    this.build();
    this.observer = new ResizeObserver(() => {
      if (this.plot) this.plot.setSize({width: this.width(), height: this.options.height || 220});
    });
    this.observer.observe(this.node);
    return this;
  }

  width() {
    return Math.max(240, this.node.clientWidth || 480);
  }

  build() {
    const time = this.options.x === 'time';
    const format = this.options.format || ((v) => (v == null ? '\u2014' : Number(v).toPrecision(4)));
    this.format = format;
    const series = [
      time ? {} : {label: this.options.x, value: (u, v) => (v == null ? '\u2014' : Number(v).toLocaleString('en-US'))},
      ...this.labels.map((label, i) => this.seriesOf(label, i, format)),
    ];
    this.plot?.destroy();
    this.plot = null;
    this.zoomed = false;
    this.plot = new this.uPlot({
      width: this.width(),
      height: this.options.height || 220,
      scales: {x: {time}},
      axes: [{label: time ? null : this.options.x}, {label: this.options.y || null, size: 60}],
      legend: {live: true},
      cursor: {drag: {x: true, y: false}},
      series,
      hooks: {draw: [(u) => this.drawMarks(u)], setScale: [(u, key) => this.zoom(u, key)]},
    }, this.view(), this.node);
  }

  seriesOf(label, i, format) {
    return {label, stroke: colour(i), width: 1, spanGaps: true, points: {show: this.options.points ?? false},
      value: (u, v) => format(v)};
  }

  /** A zoom (or its undoing) draws the visible columns at their own resolution. */
  zoom(u, key) {
    if (key !== 'x' || this.drawing || !this.xs.length) return;
    const {min, max} = u.scales.x;
    this.zoomed = min > this.xs[0] || max < this.xs[this.xs.length - 1];
    this.draw(false);
  }

  draw(rescale) {
    this.drawing = true;
    try {
      this.plot.setData(this.view(), rescale && !this.zoomed);
    } finally {
      this.drawing = false;
    }
  }

  /** What the plot is given: every column, or bucket means when there are more columns (in view)
   * than pixels across the plot. */
  view() {
    const xs = this.xs;
    let shown = xs.length;
    if (this.zoomed && this.plot) {
      const {min, max} = this.plot.scales.x;
      shown = bisect(xs, max, true) - bisect(xs, min, false);
    }
    const pixels = Math.max(200, this.width() - 80);
    const k = shown > pixels ? 2 ** Math.ceil(Math.log2(shown / pixels)) : 1;
    if (k === 1) return [xs, ...this.ys];
    const n = xs.length;
    const vx = [];
    for (let start = 0; start < n; start += k) vx.push(xs[Math.min(n, start + k) - 1]);
    return [vx, ...this.ys.map((ys) => bucketMeans(ys, k))];
  }

  /** The number of a line (made when new). */
  line(label) {
    let n = this.index.get(label);
    if (n != null) return n;
    this.labels.push(label);
    n = this.labels.length;
    this.index.set(label, n);
    this.ys.push(new Array(this.xs.length).fill(null));
    if (this.plot) this.plot.addSeries(this.seriesOf(label, n - 1, this.format), n);
    return n;
  }

  /** Add a point (x, y) to the line labelled `label`; the plot redraws on the next frame. */
  push(label, x, y) {
    if (x == null || y == null || !Number.isFinite(x) || !Number.isFinite(y)) return;
    const n = this.line(label);
    let col = this.at.get(x);
    if (col == null) col = this.column(x);
    this.ys[n - 1][col] = y;
    this.points += 1;
    this.redraw();
  }

  /** The column of a new x: at the end, or (a late point) inserted in order. */
  column(x) {
    const xs = this.xs;
    if (!xs.length || x > xs[xs.length - 1]) {
      xs.push(x);
      for (const ys of this.ys) ys.push(null);
      this.at.set(x, xs.length - 1);
      return xs.length - 1;
    }
    const lo = bisect(xs, x, false);
    xs.splice(lo, 0, x);
    for (const ys of this.ys) ys.splice(lo, 0, null);
    for (let i = lo; i < xs.length; i += 1) this.at.set(xs[i], i);
    return lo;
  }

  /** A vertical marker at x: kind is checkpoint, recovery, epoch or scale (its colour). */
  mark(x, label, kind) {
    if (x == null || this.marks.some((m) => m.x === x && m.label === label)) return;
    this.marks.push({x, label, kind});
    this.node.dataset.marks = String(this.marks.length);
    this.redraw();
  }

  /** Replace every line at once: {label: [[x, y], ...]} (a window of figures read anew). */
  replace(lines) {
    this.xs.length = 0;
    this.at.clear();
    this.ys = this.labels.map(() => []);
    const xs = [...new Set(Object.values(lines).flatMap((points) => points.map(([x]) => x)))].sort((a, b) => a - b);
    for (const x of xs) this.column(x);
    for (const [label, points] of Object.entries(lines)) {
      const n = this.line(label);
      for (const [x, y] of points) this.ys[n - 1][this.at.get(x)] = y;
    }
    this.points = Object.values(lines).reduce((sum, points) => sum + points.length, 0);
    this.redraw();
  }

  redraw() {
    this.node.dataset.points = String(this.points);
    if (!this.plot || this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.draw(true);
    });
  }

  drawMarks(u) {
    if (!this.marks.length) return;
    const ctx = u.ctx;
    const {top, height} = u.bbox;
    const ratio = window.devicePixelRatio || 1;
    ctx.save();
    ctx.font = `${10 * ratio}px system-ui, sans-serif`;
    ctx.textBaseline = 'top';
    ctx.textAlign = 'left';
    let labelled = -Infinity; // where the last label went: one close to it goes a line lower
    let row = 0;
    for (const m of this.marks) {
      const x = Math.round(u.valToPos(m.x, 'x', true));
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
      if (m.label) {
        row = Math.abs(x - labelled) < 80 * ratio ? (row + 1) % 4 : 0;
        labelled = x;
      }
      ctx.strokeStyle = ctx.fillStyle = MARK_COLOURS[m.kind] || '#667085';
      ctx.setLineDash(m.kind === 'checkpoint' ? [3 * ratio, 3 * ratio] : []);
      ctx.lineWidth = ratio;
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, top + height);
      ctx.stroke();
      ctx.fillText(m.label, x + 3 * ratio, top + (2 + 12 * row) * ratio);
    }
    ctx.restore();
  }

  destroy() {
    cancelAnimationFrame(this.frame);
    this.frame = 0;
    this.observer?.disconnect();
    this.plot?.destroy();
    this.plot = null;
  }
}

/** The first index whose x is >= value (or > value when `after`). */
function bisect(xs, value, after) {
  let lo = 0;
  let hi = xs.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] < value || (after && xs[mid] === value)) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** The mean of each run of k values (nulls left out; null where a run has none). */
function bucketMeans(ys, k) {
  const out = [];
  for (let start = 0; start < ys.length; start += k) {
    const end = Math.min(ys.length, start + k);
    let sum = 0;
    let count = 0;
    for (let i = start; i < end; i += 1) {
      const y = ys[i];
      if (y != null) {
        sum += y;
        count += 1;
      }
    }
    out.push(count ? sum / count : null);
  }
  return out;
}
