// The signed-in session and the API client: every request carries the key in its Authorization
// header (never in the URL), and every non-2xx answer becomes an ApiError with the API's code and
// message, for the banner.

const KEY_STORE = 'resontech.key';
const TENANT_STORE = 'resontech.tenant';
const TIMEOUT_MS = 30_000; // no request hangs a view (a poll waits for the one before it)

/** The signed-in caller. key: the API key; me: GET /v1/me; tenant: the tenant the views act on (a
 * tenant key's own, the operator's pick). */
export const session = {
  key: null,
  me: null,
  tenant: null,
  get operator() {
    return this.me?.kind === 'operator';
  },
  /** Members, admins and the operator may cancel; viewers only read. */
  get canWrite() {
    return this.operator || (this.me?.kind === 'tenant' && this.me.role !== 'viewer');
  },
  stored: () => sessionStorage.getItem(KEY_STORE),
  storedTenant: () => sessionStorage.getItem(TENANT_STORE),
  remember(key) {
    sessionStorage.setItem(KEY_STORE, key);
  },
  pick(tenant) {
    this.tenant = tenant || null;
    if (tenant) sessionStorage.setItem(TENANT_STORE, tenant);
    else sessionStorage.removeItem(TENANT_STORE);
  },
  forget() {
    sessionStorage.removeItem(KEY_STORE);
    sessionStorage.removeItem(TENANT_STORE);
    this.key = this.me = this.tenant = null;
  },
};

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/**
 * Call the API. query: parameters (empty values left out); scope 'tenant' adds the operator's
 * ?tenant= pick. Returns the decoded body (null for 204); throws ApiError.
 */
export async function api(path, {method = 'GET', query = {}, scope = null} = {}) {
  const url = new URL(path, location.origin);
  for (const [name, value] of Object.entries(query)) {
    if (value != null && value !== '') url.searchParams.set(name, value);
  }
  if (scope === 'tenant' && session.operator && session.tenant) url.searchParams.set('tenant', session.tenant);
  let response;
  try {
    response = await fetch(url, {
      method,
      headers: {Authorization: `Bearer ${session.key}`, Accept: 'application/json'},
      cache: 'no-store',
      signal: AbortSignal.timeout(TIMEOUT_MS),
    });
  } catch (error) {
    if (error.name === 'TimeoutError') {
      throw new ApiError(0, 'timeout', `the gateway did not answer ${method} ${url.pathname} within ${TIMEOUT_MS / 1000} s; retry`);
    }
    throw new ApiError(0, 'unreachable', 'cannot reach the gateway: check that it is running, then retry');
  }
  if (response.status === 204) return null;
  let body = null;
  try {
    body = await response.json();
  } catch {
    // an error without a JSON body (a proxy in the way): reported by status below
  }
  if (!response.ok) {
    const error = body?.error;
    throw new ApiError(
      response.status,
      error?.code || `http_${response.status}`,
      error?.message || `${method} ${url.pathname} answered ${response.status}`,
    );
  }
  return body;
}

/**
 * Fetch one resource by id when the feed says it changed, at most one request per id at a time: a
 * change announced while a fetch is in flight fetches once more after it (so the last answer is never
 * older than the last event). apply(id, body) gets null for a 404 (gone, or no longer visible).
 */
export class Refresher {
  constructor(fetchOne, apply, onError) {
    this.fetchOne = fetchOne;
    this.apply = apply;
    this.onError = onError;
    this.inflight = new Set();
    this.again = new Set();
    this.generation = 0;
  }

  busy(id) {
    return this.inflight.has(id);
  }

  request(id) {
    if (this.inflight.has(id)) this.again.add(id);
    else this.run(id);
  }

  /** Forget everything in flight (a new tenant or a reload): their answers are dropped. */
  reset() {
    this.generation += 1;
    this.inflight.clear();
    this.again.clear();
  }

  async run(id) {
    const generation = this.generation;
    this.inflight.add(id);
    try {
      const body = await this.fetchOne(id);
      if (generation === this.generation) this.apply(id, body);
    } catch (error) {
      if (generation !== this.generation) return;
      if (error.status === 404) this.apply(id, null);
      else this.onError(error);
    } finally {
      if (generation === this.generation) {
        this.inflight.delete(id);
        if (this.again.delete(id)) this.run(id);
      }
    }
  }
}
