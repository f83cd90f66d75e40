// The page's only way to the daemon: the JSON API, with the session cookie, and the
// session's CSRF token on every request that changes state.

export const session = { info: null, workspaceId: null };

export class ApiError extends Error {
  constructor(status, error) {
    super((error && error.message) || `HTTP ${status}`);
    this.status = status;
    this.code = error && error.code;
    this.details = (error && error.details) || {};
  }
}

export async function api(method, path, { query, body, headers: extra } = {}) {
  const url = new URL(path, window.location.origin);
  for (const [key, value] of Object.entries(query || {})) {
    if (value !== null && value !== undefined && value !== '') url.searchParams.set(key, value);
  }
  const headers = { ...extra, Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (method !== 'GET' && session.info && session.info.csrfToken) {
    headers['X-CSRF-Token'] = session.info.csrfToken;
  }
  const response = await fetch(url, {
    method,
    headers,
    credentials: 'same-origin',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = new ApiError(response.status, data && data.error);
    if (response.status === 401 && path !== '/api/v2/session') {
      window.dispatchEvent(new CustomEvent('runnerd:signed-out'));
    }
    throw error;
  }
  return data;
}

const RANK = { viewer: 0, member: 1, builder: 2, admin: 3 };

export function membership() {
  const info = session.info;
  if (!info) return null;
  return info.workspaces.find((w) => w.workspaceId === session.workspaceId) || null;
}

// Whether the signed-in person has at least ``role`` here (and the Apps module, when
// ``apps``): the same rule the API applies; the API still decides.
export function can(role, apps = true) {
  const found = membership();
  return Boolean(found && RANK[found.role] >= RANK[role] && (!apps || found.appsAccess));
}
