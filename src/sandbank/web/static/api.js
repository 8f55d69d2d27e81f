// The interpreter API as the page uses it (only its public routes). The API key lives in this
// module and in the tab's sessionStorage (localStorage only when the user asked to be
// remembered); the page's CSP lets no other script run on this origin to read it.

const STORAGE_KEY = "sandbank.apiKey";
let apiKey = null;

export class ApiError extends Error {
  constructor(status, message, code = null) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
  }
}

export function loadKey() {
  apiKey = sessionStorage.getItem(STORAGE_KEY) ?? localStorage.getItem(STORAGE_KEY);
  return apiKey !== null;
}

export function hasKey() {
  return apiKey !== null;
}

export function setKey(key, remember) {
  clearKey();
  apiKey = key;
  (remember ? localStorage : sessionStorage).setItem(STORAGE_KEY, key);
}

export function clearKey() {
  apiKey = null;
  sessionStorage.removeItem(STORAGE_KEY);
  localStorage.removeItem(STORAGE_KEY);
}

/** The `message` of an error body (`{message, error_code, error_id}`), or a plain fallback. */
async function errorOf(response) {
  let message = `the server answered ${response.status} ${response.statusText}`.trim();
  let code = null;
  try {
    const body = await response.json();
    if (body && typeof body.message === "string") message = body.message;
    if (body && typeof body.error_code === "number") code = body.error_code;
  } catch {
    // Not JSON (a proxy's page): the status line is all there is to say.
  }
  return new ApiError(response.status, message, code);
}

/** Calls `/api{path}`; resolves to the JSON body, rejects with an ApiError. */
export async function call(method, path, { body, query, withKey = true } = {}) {
  const url = new URL(`api${path}`, document.baseURI);
  for (const [name, value] of Object.entries(query ?? {})) url.searchParams.set(name, value);
  const headers = {};
  if (withKey && apiKey !== null) headers.Authorization = `Bearer ${apiKey}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
  } catch {
    throw new ApiError(0, "the server could not be reached; check your connection");
  }
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

const sessionPath = (sid) => `/sessions/${encodeURIComponent(sid)}`;

export const sessions = {
  list: (options) => call("GET", "/sessions", options),
  create: () => call("POST", "/sessions"),
  get: (sid) => call("GET", sessionPath(sid)),
  remove: (sid) => call("DELETE", sessionPath(sid)),
  rename: (sid, title) => call("PATCH", sessionPath(sid), { body: { title } }),
  cancel: (sid) => call("POST", `${sessionPath(sid)}/cancel`),
  ask: (sid, content) => call("POST", `${sessionPath(sid)}/messages`, { body: { content } }),
  askAgain: (sid) => call("POST", `${sessionPath(sid)}/retry`),
  messages: (sid, from) =>
    call("GET", `${sessionPath(sid)}/messages`, { query: from === null ? {} : { from } }),
  files: (sid) => call("GET", `${sessionPath(sid)}/files`),
  deleteFile: (sid, filename) =>
    call("DELETE", `${sessionPath(sid)}/files`, { query: { filename } }),
  uploadForm: (sid, filename) =>
    call("GET", `${sessionPath(sid)}/files/upload`, { query: { filename } }),
  downloadUrl: async (sid, filename) =>
    (await call("GET", `${sessionPath(sid)}/files/download`, { query: { filename } })).url,
};

/** The session's events (GET .../events, Server-Sent Events) as `{event, data}`, until the server
 * ends the stream. Read with fetch, not EventSource, which cannot send the key's header. */
export async function* events(sid, from, signal) {
  const url = new URL(`api${sessionPath(sid)}/events`, document.baseURI);
  if (from !== null) url.searchParams.set("from", from);
  const headers = { Accept: "text/event-stream" };
  if (apiKey !== null) headers.Authorization = `Bearer ${apiKey}`;
  let response;
  try {
    response = await fetch(url, { headers, cache: "no-store", signal });
  } catch {
    throw new ApiError(0, "the server could not be reached; check your connection");
  }
  if (!response.ok) throw await errorOf(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replace(/\r\n?/g, "\n");
      for (let cut = buffer.indexOf("\n\n"); cut >= 0; cut = buffer.indexOf("\n\n")) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let event = "message";
        let data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event: ")) event = line.slice(7);
          else if (line.startsWith("data: ")) data += line.slice(6);
        }
        if (data) yield { event, data: JSON.parse(data) };
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

/** The size limit a presigned form carries (ours or S3's policy), or null when unreadable. */
export function formLimit(fields) {
  try {
    const text = atob(String(fields.policy ?? fields.Policy).replace(/-/g, "+").replace(/_/g, "/"));
    const policy = JSON.parse(text);
    if (typeof policy.max_size === "number") return policy.max_size;
    for (const condition of policy.conditions ?? []) {
      if (Array.isArray(condition) && condition[0] === "content-length-range") {
        return Number(condition[2]);
      }
    }
  } catch {
    // Another store's form: the store itself will refuse a file too large.
  }
  return null;
}

function uploadError(xhr) {
  let message = `the upload was refused (${xhr.status})`;
  try {
    const body = JSON.parse(xhr.responseText);
    if (typeof body.message === "string") message = body.message;
  } catch {
    // S3 answers XML: <Error><Message>...</Message></Error>.
    const found = /<Message>([^<]*)<\/Message>/.exec(xhr.responseText ?? "");
    if (found) message = found[1];
  }
  if (xhr.status === 413 && !/large/i.test(message)) message = `the file is too large: ${message}`;
  return new ApiError(xhr.status, message);
}

/** POSTs `file` with a presigned form; `onProgress(loaded, total)` as it goes. */
export function upload(form, file, onProgress) {
  return new Promise((resolve, reject) => {
    const data = new FormData();
    for (const [name, value] of Object.entries(form.fields)) data.append(name, value);
    data.append("file", file, file.name);
    const xhr = new XMLHttpRequest();
    xhr.open("POST", form.url);
    xhr.upload.addEventListener("progress", (e) => onProgress(e.loaded, e.total));
    xhr.addEventListener("load", () =>
      xhr.status >= 200 && xhr.status < 300 ? resolve() : reject(uploadError(xhr)),
    );
    xhr.addEventListener("error", () =>
      reject(new ApiError(0, "the upload was cut off (too large, or the connection failed)")),
    );
    xhr.send(data);
  });
}
