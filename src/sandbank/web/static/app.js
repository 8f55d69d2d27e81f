// The page: sign-in, the sessions list and one session (files, conversation, runs). Every text
// from the server goes in as text nodes or through render.js; nothing is set as raw HTML.

import * as api from "./api.js";
import { displayBundle } from "./display.js";
import { codeBlock, linkedFile, renderMarkdown } from "./render.js";

const POLL_MS = 1000;
const main = document.getElementById("main");
const signOutButton = document.getElementById("sign-out");
const notice = document.getElementById("assistant-notice");
const TITLE_CHARS = 60;
const CANCELLED = "cancelled";
const ASSISTANT_RECHECK_MS = 10_000; // while the assistant cannot answer, asked again this often
// error_code of the answers saying the assistant cannot answer now (no model, or unreachable).
const ASSISTANT_DOWN = new Set([1101, 1102, 1106]);
// What the page says of the session's sandbox, where its code runs (the session's `sandbox`).
const SANDBOX_TEXT = {
  running: "Sandbox running.",
  paused: "Sandbox paused — your variables are kept; the next question resumes it.",
  none: "No sandbox: the next question starts a fresh one, without earlier variables.",
};
// From /ui/config.json: whether to ask for a key, the sessions' time to live, and whether the
// assistant can answer (if not, what the operator must set).
const state = {
  trusted: false,
  view: null,
  config: { sign_in: true, session_ttl_seconds: 0, assistant: null },
  recheck: null,
};

/** An element: string children become text nodes, `on*` props listeners. */
function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") el.className = value;
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined && child !== false) el.append(child);
  }
  return el;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function sizeText(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
}

function expiryText(ttl) {
  const seconds = ttl - Date.now() / 1000;
  const when = new Date(ttl * 1000).toLocaleString();
  if (seconds <= 0) return `expired ${when}`;
  const hours = seconds / 3600;
  const left = hours >= 48 ? `${Math.round(hours / 24)} days` : hours >= 1 ? `${Math.round(hours)} h` : `${Math.max(1, Math.round(seconds / 60))} min`;
  return `expires in ${left} (${when})`;
}

/** What a session's badge says: NEW before its first question, CANCELLED for a cancelled run. */
function statusOf(session, asked) {
  if (session.status === "DONE" && !asked) return "NEW";
  if (session.status === "ERROR" && session.status_message === CANCELLED) return "CANCELLED";
  return session.status;
}

function statusBadge(session, asked) {
  const status = statusOf(session, asked);
  return h("span", { class: `badge status-${status.toLowerCase()}` }, status);
}

/** A session's title (its given name, else its first question) on one line, shortened. */
function titleOf(question) {
  const text = question.replace(/\s+/g, " ").trim();
  return text.length <= TITLE_CHARS ? text : `${text.slice(0, TITLE_CHARS - 1).trimEnd()}…`;
}

/** What the page is called: the session's title, or "New session" before its first question. */
function showTitle(title) {
  document.title = title ? `${titleOf(title)} · Sandbank` : "Sandbank";
}

/** The assistant's state from the server (config.json), shown above every view when it cannot
 * answer; asked again every few seconds until it can. */
function showAssistant(assistant) {
  state.config.assistant = assistant;
  const down = assistant && assistant.available === false;
  notice.textContent = down ? assistant.message : "";
  notice.hidden = !down;
  clearTimeout(state.recheck);
  if (down) state.recheck = setTimeout(() => loadConfig(), ASSISTANT_RECHECK_MS);
}

/** An answer saying the assistant cannot answer now: the notice says it too, at once. */
function noteAssistantDown(error) {
  if (error instanceof api.ApiError && ASSISTANT_DOWN.has(error.code)) {
    showAssistant({ available: false, message: error.message });
    return true;
  }
  return false;
}

/** When a session was made: the API's `created_at` if it gives one, else its ttl less the TTL. */
function createdOf(session) {
  return session.created_at ?? session.ttl - state.config.session_ttl_seconds;
}

function alertBox() {
  return h("p", { class: "alert", role: "alert", hidden: true });
}

function showAlert(box, message) {
  box.textContent = message;
  box.hidden = !message;
}

function focusHeading() {
  main.querySelector("h1")?.focus();
}

/** A 403 with our key means it was revoked or mistyped: back to the sign-in form. */
function needsSignIn(error) {
  return error instanceof api.ApiError && error.status === 403 && !state.trusted && api.hasKey()
    && /API key/.test(error.message);
}

function handleFatal(error, box) {
  if (needsSignIn(error)) {
    api.clearKey();
    showSignIn("Your API key was not accepted any more; sign in again.");
    return;
  }
  showAlert(box, error.message);
}

/**
 * Arms a Delete `button`: a first click asks for a second, which runs `remove` (its failure shown
 * in `box`). A native confirm() dialog is easy to click through blindly.
 */
function armDelete(button, box, remove) {
  let armed = false;
  button.addEventListener("click", async () => {
    if (!armed) {
      armed = true;
      button.textContent = "Confirm delete";
      return;
    }
    button.disabled = true;
    try {
      await remove();
    } catch (error) {
      handleFatal(error, box);
      button.disabled = false;
    }
  });
  button.addEventListener("blur", () => {
    armed = false;
    button.textContent = "Delete";
  });
  return button;
}

// --- sign-in -------------------------------------------------------------------------------

function showSignIn(message = "") {
  leaveView();
  signOutButton.hidden = true;
  const box = alertBox();
  const key = h("input", {
    id: "api-key", type: "password", autocomplete: "off", spellcheck: "false", required: true,
  });
  const remember = h("input", { id: "remember", type: "checkbox" });
  const submit = h("button", { type: "submit" }, "Sign in");
  const form = h(
    "form",
    { class: "card sign-in", novalidate: true },
    h("h1", { tabindex: "-1" }, "Sign in"),
    h("p", {}, "Enter the API key you were given (made with ", h("code", {}, "sandbank users create"), ")."),
    h("label", { for: "api-key" }, "API key"),
    key,
    h("label", { class: "check" }, remember, " Remember me on this device"),
    box,
    submit,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const value = key.value.trim();
    if (!value) return showAlert(box, "Enter your API key.");
    submit.disabled = true;
    api.setKey(value, remember.checked);
    try {
      await api.sessions.list();
      start();
    } catch (error) {
      api.clearKey();
      showAlert(box, error.status === 403 ? "That API key was not accepted." : error.message);
      submit.disabled = false;
      key.focus();
    }
  });
  main.replaceChildren(form);
  showAlert(box, message);
  key.focus();
}

signOutButton.addEventListener("click", () => {
  api.clearKey();
  history.replaceState(null, "", "#/");
  showSignIn("You are signed out.");
});

// --- routing -------------------------------------------------------------------------------

function leaveView() {
  state.view?.close();
  state.view = null;
}

function route() {
  leaveView();
  const match = /^#\/sessions\/([0-9a-f-]{36})$/.exec(location.hash);
  state.view = match ? new SessionView(match[1]) : new SessionsView();
}

function start() {
  signOutButton.hidden = state.trusted;
  if (!location.hash) history.replaceState(null, "", "#/");
  route();
}

window.addEventListener("hashchange", () => {
  if (state.trusted || api.hasKey()) route();
});

// --- the sessions list ---------------------------------------------------------------------

class SessionsView {
  constructor() {
    showTitle(null);
    this.box = alertBox();
    this.list = h("ul", { class: "session-list" });
    this.create = h("button", { type: "button", onclick: () => this.newSession() }, "New session");
    main.replaceChildren(
      h(
        "section",
        { class: "sessions" },
        h("div", { class: "title-row" }, h("h1", { tabindex: "-1" }, "Sessions"), this.create),
        this.box,
        this.list,
      ),
    );
    focusHeading();
    this.load();
  }

  close() {}

  async load() {
    try {
      const sessions = await api.sessions.list();
      // Each session's title is its given name, else its first question (null before one).
      this.show(sessions.map((s) => ({ session: s, question: s.title ?? null })));
    } catch (error) {
      handleFatal(error, this.box);
    }
  }

  show(items) {
    if (items.length === 0) {
      this.list.replaceChildren(h("li", { class: "empty" }, "No sessions yet: start one to upload files and ask questions."));
      return;
    }
    items.sort((a, b) => createdOf(b.session) - createdOf(a.session));
    this.list.replaceChildren(...items.map((item) => this.row(item.session, item.question)));
  }

  row(session, question) {
    const remove = h("button", { type: "button", class: "secondary danger" }, "Delete");
    armDelete(remove, this.box, async () => {
      await api.sessions.remove(session.session_id);
      this.load();
    });
    return h(
      "li",
      { class: "session-row", "data-session": session.session_id },
      h(
        "a",
        { href: `#/sessions/${session.session_id}`, class: "open" },
        question === null ? h("span", { class: "title muted" }, "New session") : h("span", { class: "title" }, titleOf(question)),
      ),
      statusBadge(session, question !== null || session.status !== "DONE"),
      session.sandbox === "paused" ? h("span", { class: "sandbox-mark muted" }, "sandbox paused") : null,
      h("span", { class: "muted" }, statusOf(session, true) === "ERROR" && session.status_message ? session.status_message : ""),
      h("time", { class: "created muted", datetime: new Date(createdOf(session) * 1000).toISOString() }, `created ${new Date(createdOf(session) * 1000).toLocaleString()}`),
      h("span", { class: "expiry muted" }, expiryText(session.ttl)),
      remove,
    );
  }

  async newSession() {
    this.create.disabled = true;
    try {
      const session = await api.sessions.create();
      location.hash = `#/sessions/${session.session_id}`;
    } catch (error) {
      handleFatal(error, this.box);
      this.create.disabled = false;
    }
  }
}

// --- one session ---------------------------------------------------------------------------

class SessionView {
  constructor(sid) {
    this.sid = sid;
    this.alive = true;
    this.last = null; // timestamp of the last message shown
    this.session = null; // as last read
    this.lastQuestion = null; // the latest question, for "Ask again"
    this.polling = false;
    this.drafts = new Map(); // step -> the list item showing the model's text as it arrives
    this.aborter = new AbortController(); // ends the event stream when the view closes
    this.files = new Map(); // name -> {filename, size, origin}
    this.images = new Map(); // `${name}:${size}` -> Promise<blob: URL>
    this.build();
    this.load();
  }

  close() {
    this.alive = false;
    this.aborter.abort();
    for (const url of this.images.values()) url.then(URL.revokeObjectURL, () => {});
  }

  build() {
    this.box = alertBox();
    this.badge = h("span", { class: "badge" });
    this.expiry = h("span", { class: "expiry muted" });
    this.statusLine = h("p", { class: "status-line", role: "status", "aria-live": "polite" });
    this.sandboxLine = h("p", { class: "sandbox-state", "aria-live": "polite", hidden: true });
    this.messages = h("ol", { class: "messages hide-internal", "aria-label": "Conversation" });
    this.fileList = h("ul", { class: "file-list", "aria-label": "Files" });
    this.uploads = h("ul", { class: "uploads" });
    this.picker = h("input", { id: "file-input", type: "file", multiple: true, class: "visually-hidden", tabindex: "-1" });
    this.picker.addEventListener("change", () => {
      this.uploadAll([...this.picker.files]);
      this.picker.value = "";
    });
    const pick = h("button", { type: "button", class: "secondary", onclick: () => this.picker.click() }, "Choose files…");
    const drop = h("div", { class: "drop" }, h("p", {}, "Drop files here, or"), pick, this.picker);
    drop.addEventListener("dragover", (event) => {
      event.preventDefault();
      drop.classList.add("over");
    });
    drop.addEventListener("dragleave", () => drop.classList.remove("over"));
    drop.addEventListener("drop", (event) => {
      event.preventDefault();
      drop.classList.remove("over");
      this.uploadAll([...event.dataTransfer.files]);
    });
    this.question = h("textarea", { id: "question", rows: "3", placeholder: "Ask about your files… (Enter sends, Shift+Enter for a new line)" });
    this.question.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.form.requestSubmit();
      }
    });
    this.askButton = h("button", { type: "submit" }, "Ask");
    this.cancelButton = h("button", { type: "button", class: "secondary danger", hidden: true, onclick: () => this.cancel() }, "Cancel run");
    this.retryButton = h("button", { type: "button", class: "secondary", hidden: true, onclick: () => this.askAgain() }, "Ask again");
    this.form = h(
      "form",
      { class: "ask" },
      h("label", { for: "question", class: "visually-hidden" }, "Question"),
      this.question,
      h("div", { class: "ask-buttons" }, this.askButton, this.retryButton, this.cancelButton),
    );
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.ask();
    });
    const internal = h("input", { id: "show-internal", type: "checkbox" });
    internal.addEventListener("change", () => this.messages.classList.toggle("hide-internal", !internal.checked));
    this.messages.addEventListener("click", (event) => {
      const anchor = event.target.closest("a");
      const name = anchor && linkedFile(anchor);
      if (name) {
        event.preventDefault();
        this.download(name);
      }
    });
    this.heading = h("h1", { tabindex: "-1" }, "New session");
    this.renameButton = h("button", { type: "button", class: "secondary small", onclick: () => this.startRename() }, "Rename");
    this.titleRow = h("div", { class: "title-row" }, this.heading, this.renameButton, this.badge, this.expiry);
    this.chats = h("ul", { class: "chat-list" });
    main.replaceChildren(
      h(
        "section",
        { class: "session" },
        h("nav", {}, h("a", { href: "#/" }, "← All sessions")),
        this.titleRow,
        this.box,
        h(
          "div",
          { class: "layout" },
          h(
            "aside",
            { class: "side" },
            h("nav", { class: "chats card", "aria-label": "Your sessions" }, h("h2", {}, "Your sessions"), this.chats),
            h("section", { class: "files card", "aria-label": "Files" }, h("h2", {}, "Files"), drop, this.uploads, this.fileList),
          ),
          h(
            "div",
            { class: "chat" },
            h("label", { class: "check toggle" }, internal, " Show internal messages (code, output, traces)"),
            this.messages,
            this.statusLine,
            this.sandboxLine,
            this.form,
          ),
        ),
      ),
    );
    focusHeading();
  }

  async load() {
    this.loadChats();
    try {
      const [session] = await Promise.all([api.sessions.get(this.sid), this.refreshFiles()]);
      await this.fetchMessages();
      this.showSession(session);
      if (session.status === "PENDING") this.watch();
    } catch (error) {
      if (error.status === 404) showAlert(this.box, "This session does not exist any more (deleted or expired).");
      else handleFatal(error, this.box);
      this.setBusy(true);
      this.cancelButton.hidden = true;
    }
  }

  /** The user's other sessions, to go back to one (this one marked). */
  async loadChats() {
    let sessions;
    try {
      sessions = await api.sessions.list();
    } catch (error) {
      if (needsSignIn(error)) handleFatal(error, this.box);
      return; // the list is a convenience: the session itself still works
    }
    if (!this.alive) return;
    sessions.sort((a, b) => createdOf(b) - createdOf(a));
    const current = (s) => s.session_id === this.sid;
    this.chats.replaceChildren(
      ...sessions.map((s) =>
        h(
          "li",
          { "data-session": s.session_id },
          h(
            "a",
            { href: `#/sessions/${s.session_id}`, "aria-current": current(s) ? "page" : null, class: s.title ? null : "muted" },
            s.title ? titleOf(s.title) : "New session",
          ),
        ),
      ),
    );
  }

  /** The heading, the tab's title and this session's entry in the list follow its title. */
  showTitle(title) {
    this.title = title;
    this.heading.textContent = title ? titleOf(title) : "New session";
    if (title) this.heading.title = title;
    showTitle(title);
    const link = this.chats.querySelector(`li[data-session="${this.sid}"] a`);
    if (link) {
      link.textContent = title ? titleOf(title) : "New session";
      link.classList.toggle("muted", !title);
    }
  }

  startRename() {
    const input = h("input", { type: "text", value: this.title ?? "", maxlength: "200", "aria-label": "Session name", class: "rename-input" });
    const save = h("button", { type: "submit", class: "small" }, "Save");
    const cancel = h("button", { type: "button", class: "secondary small" }, "Cancel");
    const form = h("form", { class: "rename" }, input, save, cancel);
    const done = () => {
      form.replaceWith(this.heading);
      this.renameButton.hidden = false;
      this.renameButton.focus();
    };
    cancel.addEventListener("click", done);
    input.addEventListener("keydown", (event) => {
      if (event.key === "Escape") done();
    });
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      save.disabled = true;
      try {
        // A blank name gives the session its first question back as its title.
        const session = await api.sessions.rename(this.sid, input.value.trim() || null);
        this.showTitle(session.title ?? null);
        done();
      } catch (error) {
        handleFatal(error, this.box);
        save.disabled = false;
      }
    });
    this.heading.replaceWith(form);
    this.renameButton.hidden = true;
    input.focus();
    input.select();
  }

  showSession(session) {
    this.session = session;
    if (session.title !== undefined || this.title === undefined) this.showTitle(session.title ?? null);
    const status = statusOf(session, this.lastQuestion !== null);
    this.badge.replaceWith((this.badge = statusBadge(session, this.lastQuestion !== null)));
    this.expiry.textContent = expiryText(session.ttl);
    const pending = status === "PENDING";
    this.statusLine.classList.toggle("error", status === "ERROR");
    this.statusLine.classList.toggle("cancelled", status === "CANCELLED");
    if (pending) this.statusLine.textContent = `Working: ${session.status_message || "pending"}…`;
    else if (status === "CANCELLED") this.statusLine.textContent = "Cancelled.";
    else if (status === "ERROR") this.statusLine.textContent = `The run ended with an error: ${session.status_message || "unknown error"}`;
    else this.statusLine.textContent = "";
    // A run that found the model unreachable: the notice above says so and what to set.
    if (status === "ERROR" && /cannot be reached/.test(session.status_message ?? "")) loadConfig();
    this.setBusy(pending);
    this.retryButton.hidden = pending || !(status === "ERROR" || status === "CANCELLED") || this.lastQuestion === null;
    // A question runs in the sandbox (a paused one is resumed for it).
    this.showSandbox(pending ? "running" : session.sandbox);
  }

  /** The sandbox's state; undefined (an answer that does not say, the stream's status) keeps
   * what is shown. Before the first question there is nothing to say. */
  showSandbox(sandbox) {
    if (sandbox === undefined) return;
    const text = sandbox === "none" && this.lastQuestion === null ? "" : SANDBOX_TEXT[sandbox] ?? "";
    this.sandboxLine.textContent = text;
    this.sandboxLine.hidden = !text;
    this.sandboxLine.dataset.sandbox = sandbox;
  }

  setBusy(busy) {
    this.question.disabled = busy;
    this.askButton.disabled = busy;
    this.retryButton.disabled = busy;
    this.cancelButton.hidden = !busy;
    this.cancelButton.disabled = false;
  }

  /** Follows the run through the event stream (the model's text as it comes); polls instead
   * when the stream cannot be had or breaks. */
  async watch() {
    if (this.polling) return;
    this.polling = true;
    this.setBusy(true);
    let ended = null;
    try {
      // The stream ends itself after a while ("timeout"): then it is opened again.
      for (let opened = 0; this.alive && opened < 100; opened++) {
        ended = await this.stream();
        if (ended !== "timeout") break;
      }
    } catch (error) {
      if (!this.alive) return;
      if (needsSignIn(error)) return handleFatal(error, this.box);
      ended = null;
    } finally {
      this.polling = false;
      this.clearDrafts();
    }
    if (!this.alive) return;
    if (ended === "ended") {
      // The session is read again for what the stream does not say: its sandbox's state.
      const session = api.sessions.get(this.sid).then((s) => this.alive && this.showSession(s));
      await Promise.all([this.refreshFiles(), session]).catch((error) => handleFatal(error, this.box));
      this.question.focus();
    } else {
      this.poll(); // broken, refused, or the server stopped: polling carries on
    }
  }

  /** One event stream, read to its end; returns the end's reason, or null if it broke off. */
  async stream() {
    for await (const { event, data } of api.events(this.sid, this.last, this.aborter.signal)) {
      if (!this.alive) return null;
      if (event === "text") this.draft(data.step, data.text);
      else if (event === "message") this.addMessages([data]);
      else if (event === "status") this.showSession(data);
      else if (event === "end") {
        if (data.reason === "shutdown") this.statusLine.textContent = "The server is restarting; the answer goes on once it is back…";
        return data.reason;
      }
    }
    return null;
  }

  /** The model's text for `step` as it is generated (a stored message replaces it). */
  draft(step, text) {
    let item = this.drafts.get(step);
    if (!item) {
      item = h("li", { class: "msg assistant draft", "aria-busy": "true" }, h("div", { class: "markdown" }, h("p", {})));
      this.drafts.set(step, item);
      this.messages.append(item);
    }
    item.querySelector("p").append(text);
    item.scrollIntoView({ block: "nearest" });
  }

  clearDrafts(upTo = Infinity) {
    for (const [step, item] of this.drafts) {
      if (step <= upTo) {
        item.remove();
        this.drafts.delete(step);
      }
    }
  }

  async poll() {
    if (this.polling) return;
    this.polling = true;
    this.setBusy(true);
    try {
      while (this.alive) {
        await sleep(POLL_MS);
        if (!this.alive) return;
        try {
          // The session first: once it is no longer PENDING, the messages read after it are all.
          const session = await api.sessions.get(this.sid);
          await this.fetchMessages();
          this.showSession(session);
          if (session.status !== "PENDING") {
            await this.refreshFiles();
            this.question.focus();
            return;
          }
          showAlert(this.box, "");
        } catch (error) {
          if (error.status === 404 || needsSignIn(error)) return handleFatal(error, this.box);
          const restarting = error.status === 0 || error.status === 502 || error.status === 503;
          showAlert(this.box, restarting ? "The server is restarting or cannot be reached; retrying…" : `${error.message} (retrying)`);
        }
      }
    } finally {
      this.polling = false;
    }
  }

  async fetchMessages() {
    const fresh = await api.sessions.messages(this.sid, this.last);
    if (this.alive) this.addMessages(fresh);
  }

  addMessages(fresh) {
    let added = false;
    for (const message of fresh) {
      if (this.last !== null && message.timestamp <= this.last) continue;
      this.last = message.timestamp;
      // A model call's trace is stored first of what it did: its streamed text is done.
      if (message.role === "trace") this.clearDrafts(parseRecord(message.content)?.step ?? Infinity);
      this.messages.append(...this.messageItems(message));
      added = true;
    }
    if (added) this.messages.lastElementChild?.scrollIntoView({ block: "nearest" });
  }

  /** A message's list items: a tool call's displays follow it, shown even when it is hidden. */
  messageItems(message) {
    const items = [this.messageItem(message)];
    const displays = message.role === "tool" ? parseRecord(message.content)?.output?.displays : null;
    if (Array.isArray(displays) && displays.length) {
      const shown = displays.map((bundle) => displayBundle(bundle, (name) => this.image(name)));
      items.push(h("li", { class: "msg displays", "aria-label": "Displayed output" }, ...shown));
    }
    return items;
  }

  messageItem(message) {
    const classes = ["msg", message.role];
    if (message.internal) classes.push("internal");
    const when = new Date(message.timestamp * 1000).toLocaleTimeString();
    const item = h("li", { class: classes.join(" "), title: when });
    if (message.role === "user") {
      this.lastQuestion = message.content;
      if (!this.title) this.showTitle(message.content);
      item.append(h("div", { class: "bubble" }, message.content));
    } else if (message.role === "assistant") {
      if (message.internal) item.append(h("p", { class: "label" }, "Note"));
      const body = h("div", { class: "markdown" });
      body.append(renderMarkdown(message.content, (name) => this.image(name)));
      item.append(body);
    } else if (message.role === "tool") {
      item.append(toolCall(message.content));
    } else if (message.role === "trace") {
      item.append(trace(message.content));
    } else {
      item.append(h("pre", {}, message.content));
    }
    return item;
  }

  /** Posts the question typed. */
  async ask() {
    const content = this.question.value.trim();
    if (!content) return;
    await this.start(async () => {
      const message = await api.sessions.ask(this.sid, content);
      this.question.value = "";
      this.addMessages([message]);
    });
  }

  /** Runs the latest question again, in place: the conversation keeps it once. */
  async askAgain() {
    await this.start(() => api.sessions.askAgain(this.sid));
  }

  async start(post) {
    this.setBusy(true);
    showAlert(this.box, "");
    try {
      await post();
      // Badge and status line change together, before the first poll.
      this.showSession({ ...this.session, status: "PENDING", status_message: "pending" });
      this.watch();
    } catch (error) {
      // The notice above says what is wrong and what the operator must set; once is enough.
      if (noteAssistantDown(error)) showAlert(this.box, "Not sent: the assistant cannot answer now (see above). Your question is kept here.");
      else handleFatal(error, this.box);
      this.setBusy(false);
      this.retryButton.hidden = this.retryButton.hidden && this.lastQuestion === null;
    }
  }

  async cancel() {
    this.cancelButton.disabled = true;
    try {
      this.showSession(await api.sessions.cancel(this.sid));
    } catch (error) {
      handleFatal(error, this.box);
      this.cancelButton.disabled = false;
    }
  }

  // --- files -------------------------------------------------------------------------------

  async refreshFiles() {
    const files = await api.sessions.files(this.sid);
    if (!this.alive) return;
    this.files = new Map(files.map((f) => [f.filename, f]));
    if (files.length === 0) {
      this.fileList.replaceChildren(h("li", { class: "empty muted" }, "No files yet."));
      return;
    }
    this.fileList.replaceChildren(
      ...files.map((f) =>
        h(
          "li",
          { class: "file", "data-file": f.filename },
          h("button", { type: "button", class: "link download", "data-name": f.filename, onclick: () => this.download(f.filename) }, f.filename),
          h("span", { class: "muted" }, ` ${sizeText(f.size)} · ${f.origin === "user" ? "uploaded" : "produced"}`),
          this.deleteButton(f.filename),
        ),
      ),
    );
  }

  /** A file's Delete button. */
  deleteButton(name) {
    const button = h("button", { type: "button", class: "link danger delete-file", "aria-label": `Delete ${name}` }, "Delete");
    return armDelete(button, this.box, async () => {
      await api.sessions.deleteFile(this.sid, name);
      await this.refreshFiles();
    });
  }

  async uploadAll(files) {
    for (const file of files) {
      let chosen = file;
      if (this.files.has(file.name)) {
        const choice = await this.askAboutExisting(file);
        if (choice === "skip") continue;
        if (choice === "keep") chosen = new File([file], this.freeName(file.name), { type: file.type });
      }
      await this.uploadOne(chosen);
      // The next file of the same name is compared with this one too.
      this.files.set(chosen.name, { filename: chosen.name, size: chosen.size, origin: "user" });
    }
    try {
      await this.refreshFiles();
    } catch (error) {
      handleFatal(error, this.box);
    }
  }

  /** `data.csv` → `data-2.csv` (or -3, ...): a name no file of the session has. */
  freeName(name) {
    const dot = name.lastIndexOf(".");
    const [stem, ext] = dot > 0 ? [name.slice(0, dot), name.slice(dot)] : [name, ""];
    let n = 2;
    while (this.files.has(`${stem}-${n}${ext}`)) n++;
    return `${stem}-${n}${ext}`;
  }

  /** A file of that name is here already: replace it, keep both, or leave it. */
  askAboutExisting(file) {
    return new Promise((resolve) => {
      const other = this.freeName(file.name);
      const answer = (choice) => {
        item.remove();
        resolve(choice);
      };
      const replace = h("button", { type: "button", class: "small", onclick: () => answer("replace") }, "Replace");
      const keep = h("button", { type: "button", class: "secondary small", onclick: () => answer("keep") }, `Keep both (as ${other})`);
      const skip = h("button", { type: "button", class: "secondary small", onclick: () => answer("skip") }, "Don't upload");
      const item = h(
        "li",
        { class: "upload conflict", role: "alert" },
        h("strong", {}, file.name),
        " is already in this session.",
        h("span", { class: "choices" }, replace, keep, skip),
      );
      this.uploads.append(item);
      keep.focus();
    });
  }

  async uploadOne(file) {
    const bar = h("progress", { max: "1", value: "0" });
    const text = h("span", {}, "asking for an upload form…");
    const item = h("li", { class: "upload" }, h("strong", {}, file.name), " ", text, bar);
    this.uploads.append(item);
    try {
      const form = await api.sessions.uploadForm(this.sid, file.name);
      const limit = api.formLimit(form.fields);
      if (limit !== null && file.size > limit) {
        throw new api.ApiError(413, `the file is too large: ${sizeText(file.size)}, and at most ${sizeText(limit)} may be uploaded here`);
      }
      text.textContent = "uploading…";
      await api.upload(form, file, (loaded, total) => {
        bar.max = total || 1;
        bar.value = loaded;
        text.textContent = `uploading… ${Math.floor((100 * loaded) / (total || 1))}%`;
      });
      item.remove();
    } catch (error) {
      if (needsSignIn(error)) return handleFatal(error, this.box);
      bar.remove();
      item.classList.add("refused");
      item.setAttribute("role", "alert");
      text.textContent = `refused: ${error.message}`;
      item.append(h("button", { type: "button", class: "link", onclick: () => item.remove() }, "Dismiss"));
    }
  }

  /** A blob: URL of a session image (fetched through its presigned URL once per version). */
  image(name) {
    const size = this.files.get(name)?.size ?? "?";
    const key = `${name}:${size}`;
    if (!this.images.has(key)) {
      this.images.set(
        key,
        (async () => {
          const url = await api.sessions.downloadUrl(this.sid, name);
          const response = await fetch(url, { credentials: "omit", cache: "no-store" });
          if (!response.ok) throw new Error(`the server answered ${response.status}`);
          const blob = await response.blob();
          if (!blob.type.startsWith("image/")) throw new Error("it is not an image");
          return URL.createObjectURL(blob);
        })(),
      );
    }
    return this.images.get(key);
  }

  /** Saves a session file: an attachment, never opened as a page of this site. */
  async download(name) {
    try {
      const url = await api.sessions.downloadUrl(this.sid, name);
      const base = name.split("/").pop();
      let href = url;
      if (new URL(url, location.href).origin !== location.origin) {
        // Another origin (S3) ignores `download`: fetch it, then save the bytes from here.
        const response = await fetch(url, { credentials: "omit" });
        if (!response.ok) throw new Error(`the download failed (${response.status})`);
        href = URL.createObjectURL(await response.blob());
        setTimeout(() => URL.revokeObjectURL(href), 60_000);
      }
      const link = h("a", { href, download: base, rel: "noreferrer", class: "visually-hidden" });
      document.body.append(link);
      link.click();
      link.remove();
    } catch (error) {
      handleFatal(error, this.box);
    }
  }
}

function parseRecord(content) {
  try {
    const record = JSON.parse(content);
    return record && typeof record === "object" ? record : null;
  } catch {
    return null;
  }
}

function toolCall(content) {
  const record = parseRecord(content);
  if (!record) return h("pre", {}, content);
  const input = record.input ?? {};
  const out = record.output;
  const facts = [`step ${record.step}`];
  if (out) facts.push(`${out.duration_ms} ms`, out.return_code === 0 ? "ok" : `exit ${out.return_code}`);
  const interrupted = typeof record.error === "string" && record.error.startsWith("interrupted");
  if (interrupted) facts.push("interrupted");
  else if (record.error) facts.push("failed");
  const body = [];
  if (typeof input.code === "string") body.push(codeBlock(input.code, "python"));
  else if (record.tool === "bash" && typeof input.command === "string") body.push(codeBlock(input.command, "bash"));
  else body.push(codeBlock(JSON.stringify(input, null, 2), "json"));
  if (out) {
    if (out.stdout) body.push(h("p", { class: "label" }, "Output"), h("pre", { class: "stdout" }, out.stdout));
    if (out.stderr) body.push(h("p", { class: "label" }, "Errors"), h("pre", { class: "stderr" }, out.stderr));
    if (out.files?.length) body.push(h("p", { class: "label" }, `Files: ${out.files.join(", ")}`));
  }
  if (record.error) body.push(h("p", { class: interrupted ? "note" : "stderr" }, record.error));
  return h("details", { class: "tool-call" }, h("summary", {}, `Tool call: ${record.tool} (${facts.join(", ")})`), ...body);
}

function trace(content) {
  const record = parseRecord(content);
  if (!record) return h("pre", {}, content);
  const calls = record.tool_calls === 1 ? "1 tool call" : `${record.tool_calls} tool calls`;
  return h(
    "p",
    { class: "trace-line" },
    `Model call ${record.step} (${record.model}): ${record.input_tokens} tokens in, ${record.output_tokens} out, ${record.latency_ms} ms, ${calls}`,
  );
}

// --- start ---------------------------------------------------------------------------------

/** The page's settings; asking never fails with a 4xx, so nothing is logged on load. */
async function loadConfig() {
  try {
    const response = await fetch(new URL("ui/config.json", document.baseURI), { cache: "no-store" });
    if (response.ok) Object.assign(state.config, await response.json());
  } catch {
    // Unreachable: the sign-in form will say so when it is used.
  }
  showAssistant(state.config.assistant);
}

async function boot() {
  await loadConfig();
  if (api.loadKey()) return start();
  // Behind an authenticating proxy (trusted user header) the API answers without a key.
  if (!state.config.sign_in) {
    state.trusted = true;
    return start();
  }
  showSignIn();
}

boot();
