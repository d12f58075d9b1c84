// The dashboard's entry point: sign-in, the tabs each kind of caller sees, the operator's tenant
// pick, and the feed wired to the views.
//
// Sign-in asks GET /v1/me what the pasted key is: a tenant key sees jobs, endpoints and billing; a
// provider key its workers and payouts; the operator picks a tenant and sees everything. The key is
// kept in sessionStorage (this tab only) and sent in the Authorization header.
//
// Live updates: the feed connects first; once it says feed.ready the lists are read, and every
// event after that point is applied to them (events arriving while a list loads wait for it), so
// nothing falls between the list and the feed. After a drop the feed resumes from its cursor; if it
// had to start afresh, the lists are read again.

import {$, banner, h, report} from './dom.js';
import {api, session} from './api.js';
import {Feed, indicate} from './feed.js';
import {jobs} from './jobs.js';
import {billing} from './billing.js';
import {endpoints} from './endpoints.js';
import {payouts, workers} from './provider.js';
import {fleet} from './series.js';

const TABS = {
  tenant: ['jobs', 'endpoints', 'billing'],
  provider: ['workers', 'payouts'],
  operator: ['jobs', 'endpoints', 'billing', 'workers', 'payouts', 'fleet'],
};
const TENANT_VIEWS = new Set(['jobs', 'endpoints', 'billing']);
const VIEWS = {jobs, endpoints, billing, workers, payouts, fleet};
const READY_WAIT_MS = 3_000;

let shownTab = null;
let readyTimer = null;

const feed = new Feed({
  message(m) {
    if (m.kind === 'telemetry') {
      jobs.message(m);
    } else if (m.stream === 'JOBS') {
      jobs.message(m);
    } else if (m.stream === 'ENDPOINTS') {
      endpoints.message(m);
    }
  },
  ready(resumed) {
    clearTimeout(readyTimer);
    if (!resumed) readTenantLists();
  },
});

function readTenantLists() {
  jobs.reload();
  endpoints.reload();
  billing.reset();
  if (shownTab === 'billing') billing.load();
}

/** Start the tenant views on the current tenant: the feed first, the lists when it is live (or
 * after 3 s without it, so that a feed outage leaves a usable page). */
function startTenant() {
  for (const view of [jobs, endpoints, billing]) view.reset();
  clearTimeout(readyTimer);
  if (!session.tenant) {
    feed.stop();
    return;
  }
  feed.start();
  readyTimer = setTimeout(readTenantLists, READY_WAIT_MS);
}

function showTab(name) {
  const allowed = TABS[session.me.kind];
  if (!allowed.includes(name)) name = allowed[0];
  if (shownTab && shownTab !== name) VIEWS[shownTab].hidden?.();
  shownTab = name;
  for (const button of $('tabs').children) button.setAttribute('aria-selected', String(button.dataset.tab === name));
  for (const section of document.querySelectorAll('main > .view')) section.hidden = true;
  if (TENANT_VIEWS.has(name) && !session.tenant) {
    $('pick-tenant').hidden = false;
    return;
  }
  $(`view-${name}`).hidden = false;
  VIEWS[name].shown?.();
  history.replaceState(null, '', `#${name}`);
}

async function pickTenant(tenant) {
  session.pick(tenant);
  startTenant();
  showTab(shownTab);
}

async function loadTenants() {
  const select = $('tenant-select');
  const tenants = await api('/v1/tenants');
  select.replaceChildren(h('option', {value: ''}, 'pick a tenant'),
    ...tenants.map((t) => h('option', {value: t.tenant}, t.display_name && t.display_name !== t.tenant
      ? `${t.tenant} (${t.display_name})` : t.tenant)));
  const stored = session.storedTenant();
  if (stored && tenants.some((t) => t.tenant === stored)) {
    select.value = stored;
    session.tenant = stored;
  }
}

async function enter() {
  const me = session.me;
  $('sign-in').hidden = true;
  $('sign-out').hidden = false;
  $('who').textContent = me.kind === 'tenant' ? `${me.principal} \u00b7 ${me.role}` : me.principal;
  $('tabs').replaceChildren(...TABS[me.kind].map((name) => {
    const button = h('button', {type: 'button', role: 'tab', dataset: {tab: name}}, $(`view-${name}`).dataset.title);
    button.addEventListener('click', () => showTab(name));
    return button;
  }));
  $('tenant-pick').hidden = me.kind !== 'operator';
  if (me.kind === 'tenant') session.tenant = me.account;
  if (me.kind === 'operator') {
    try {
      await loadTenants();
    } catch (error) {
      report(error);
    }
  }
  if (me.kind === 'provider') {
    indicate('polling', 'polling', 'providers have no live feed: workers are re-read every 10 s');
  } else {
    startTenant();
  }
  showTab(location.hash.slice(1));
}

async function signIn(key) {
  banner.clear();
  if (!/^[\x21-\x7e]+$/.test(key)) { // a header cannot carry it; the API would never know it anyway
    report({code: 'invalid_key', message: 'an API key is one word of plain ASCII (rt_...): check what was pasted'});
    $('sign-in').hidden = false;
    return;
  }
  session.key = key;
  try {
    session.me = await api('/v1/me');
  } catch (error) {
    session.forget();
    report(error);
    $('sign-in').hidden = false;
    $('key').focus();
    return;
  }
  session.remember(key);
  $('key').value = '';
  await enter();
}

function signOut() {
  feed.stop();
  clearTimeout(readyTimer);
  for (const view of Object.values(VIEWS)) {
    view.hidden?.();
    view.reset();
  }
  session.forget();
  shownTab = null;
  $('tabs').replaceChildren();
  $('who').textContent = '';
  $('sign-out').hidden = true;
  $('tenant-pick').hidden = true;
  for (const section of document.querySelectorAll('main > .view')) section.hidden = true;
  $('sign-in').hidden = false;
  banner.clear();
  history.replaceState(null, '', location.pathname);
}

function main() {
  for (const view of Object.values(VIEWS)) view.init();
  $('sign-in-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const key = $('key').value.trim();
    if (key) signIn(key);
  });
  $('sign-out').addEventListener('click', signOut);
  $('banner-close').addEventListener('click', () => banner.clear());
  $('tenant-select').addEventListener('change', (e) => pickTenant(e.target.value));
  window.addEventListener('hashchange', () => session.me && showTab(location.hash.slice(1)));
  const stored = session.stored();
  if (stored) {
    $('sign-in').hidden = true; // signed in already in this tab: no flash of the form
    signIn(stored);
  }
}

main();
