// One WebSocket to /v1/feed (the protocol is in the API description, gateway/feed.py).
//
// The browser cannot set headers on a WebSocket, so the key goes in the first message. The feed
// remembers, per stream, the last sequence it has seen (events, and the cursor of feed.ready and
// feed.ping) and reconnects after a drop with ?after=jobs:N,endpoints:M: the gateway replays what
// was missed, so no event is lost and none is applied twice. Closes that a retry cannot fix (a bad
// or revoked key, a refused tenant) stop it and show the reason in the banner.

import {$, banner} from './dom.js';
import {session} from './api.js';

const SILENCE_MS = 60_000; // the gateway pings after 20 s of quiet: a minute of nothing is a dead link
const MAX_BACKOFF_MS = 15_000;
const FATAL = new Set([4401, 4403, 4404]);

/** The connection indicator in the top bar: off, connecting, live, retrying, polling, failed. */
export function indicate(state, text, title) {
  const conn = $('conn');
  conn.dataset.state = state;
  conn.title = title || `live feed: ${text}`;
  $('conn-text').textContent = text;
}

export class Feed {
  /**
   * hooks.message(m): an event or telemetry message; hooks.ready(resumed): the feed is live
   * (resumed: it continued from a cursor, so nothing was missed; else the views must reload).
   */
  constructor(hooks) {
    this.hooks = hooks;
    this.ws = null;
    this.positions = null;
    this.attempt = 0;
    this.timer = null;
    this.heard = 0;
    this.error = null;
    setInterval(() => this.watch(), 5_000);
  }

  start() {
    this.stop();
    this.positions = null;
    this.attempt = 0;
    this.open();
  }

  stop() {
    clearTimeout(this.timer);
    const ws = this.ws;
    this.ws = null;
    if (ws) ws.close(1000, 'signed out');
    indicate('off', 'offline');
  }

  /** jobs:N,endpoints:M, or null before the first position is known (the feed then starts live). */
  cursor() {
    return this.positions ? `jobs:${this.positions.jobs},endpoints:${this.positions.endpoints}` : null;
  }

  open() {
    const query = new URLSearchParams();
    const cursor = this.cursor();
    if (cursor) query.set('after', cursor);
    if (session.operator) query.set('tenant', session.tenant);
    const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
    const search = query.toString();
    const url = `${scheme}://${location.host}/v1/feed${search ? `?${search}` : ''}`;
    indicate(this.attempt ? 'retrying' : 'connecting', this.attempt ? 'reconnecting' : 'connecting');
    const ws = new WebSocket(url);
    this.ws = ws;
    this.heard = Date.now();
    this.error = null;
    this.resumed = cursor != null;
    ws.onopen = () => ws.send(JSON.stringify({kind: 'auth', key: session.key}));
    ws.onmessage = (message) => {
      if (ws !== this.ws) return;
      this.heard = Date.now();
      let parsed;
      try {
        parsed = JSON.parse(message.data);
      } catch {
        return;
      }
      this.receive(parsed);
    };
    ws.onclose = (close) => {
      if (ws !== this.ws) return; // stopped on purpose, or replaced
      this.ws = null;
      this.closed(close.code);
    };
  }

  receive(m) {
    switch (m.kind) {
      case 'feed.ready':
        this.advance(m.cursor);
        this.attempt = 0;
        indicate('live', 'live', `live feed: connected (${this.cursor()})`);
        this.hooks.ready(this.resumed);
        return;
      case 'feed.ping':
        this.advance(m.cursor);
        return;
      case 'feed.error':
        this.error = m.error;
        return;
      default:
        if (m.stream === 'JOBS' || m.stream === 'ENDPOINTS') {
          const name = m.stream === 'JOBS' ? 'jobs' : 'endpoints';
          this.positions ??= {jobs: 0, endpoints: 0};
          this.positions[name] = Math.max(this.positions[name], m.seq);
        }
        this.hooks.message(m);
    }
  }

  advance(cursor) {
    this.positions ??= {jobs: 0, endpoints: 0};
    for (const part of (cursor || '').split(',')) {
      const [name, seq] = part.split(':');
      if (name in this.positions) this.positions[name] = Math.max(this.positions[name], Number(seq) || 0);
    }
  }

  closed(code) {
    const error = this.error;
    if (FATAL.has(code) || (code === 4400 && !/beyond the last/.test(error?.message || ''))) {
      indicate('failed', 'disconnected', `live feed: closed with ${code}`);
      banner.show(error || {code: 'feed_closed', message: `the live feed closed with code ${code}`});
      return;
    }
    if (code === 4400) this.positions = null; // the log was reset under us: start live and reload
    this.retry(code === 4008 ? 0 : Math.min(MAX_BACKOFF_MS, 500 * 2 ** this.attempt));
  }

  retry(delay) {
    this.attempt += 1;
    const wait = Math.round(delay * (0.8 + Math.random() * 0.4));
    indicate('retrying', `reconnecting in ${Math.ceil(wait / 1000)} s`);
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.open(), wait);
  }

  /** A connection that went silent (no ping for a minute) is dead even if the socket says open. */
  watch() {
    if (this.ws && Date.now() - this.heard > SILENCE_MS) {
      const ws = this.ws;
      this.ws = null;
      ws.close();
      this.retry(0);
    }
  }
}
