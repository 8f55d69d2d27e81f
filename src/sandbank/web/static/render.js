// Turns untrusted text (answers, tool code and output) into inert DOM: Markdown through marked
// with raw HTML shown as text, then DOMPurify; images only from the session's own files, never
// from an outside address.

import DOMPurify from "./vendor/purify.es.mjs";
import hljs from "./vendor/highlight-core.min.js";
import bash from "./vendor/highlight-bash.min.js";
import python from "./vendor/highlight-python.min.js";
import { Marked } from "./vendor/marked.esm.js";

hljs.registerLanguage("python", python);
hljs.registerLanguage("bash", bash);
hljs.configure({ ignoreUnescapedHTML: true });

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escapeHtml = (text) => text.replace(/[&<>"']/g, (c) => ESCAPES[c]);
// Raw HTML in an answer is shown as the text it is: parsing it, even only to sanitize it, makes
// the browser report every inline handler it holds as a CSP violation, and answers need none.
const markdown = new Marked({ gfm: true, async: false, renderer: { html: ({ text }) => escapeHtml(text) } });

const LANGUAGES = { python: "python", py: "python", bash: "bash", sh: "bash", shell: "bash" };
// The attribute the sanitizer moves an image's target to, so that nothing loads it unasked.
const SRC = "data-sb-src";
const FILE = "data-sb-file";
// A session file's name as the API accepts it (see sandbank.files.names), path parts allowed.
const PART = /^(?![.-])(?!.*\.\.)[\p{L}\p{N} ._\-()+,=@]+$/u;

/** The session file a Markdown target names (`chart.png`, `./out/a.png`), else null. */
export function sessionFile(target) {
  if (!target || /^[a-z][a-z0-9+.-]*:/i.test(target) || target.startsWith("//")) return null;
  let name;
  try {
    name = decodeURIComponent(target.split(/[?#]/)[0]);
  } catch {
    return null;
  }
  name = name.replace(/^\/?workspace\//, "").replace(/^(\.\/)+/, "");
  const parts = name.split("/");
  return parts.every((p) => PART.test(p)) ? name.normalize("NFC") : null;
}

function isOutsideLink(href) {
  try {
    const url = new URL(href);
    return url.protocol === "https:" || url.protocol === "http:" || url.protocol === "mailto:";
  } catch {
    return false;
  }
}

const purifier = DOMPurify(window);
purifier.addHook("afterSanitizeAttributes", (node) => {
  // Ids and names could shadow the page's own elements; classes could mimic its controls.
  node.removeAttribute("id");
  node.removeAttribute("name");
  const language = node.tagName === "CODE" && /^language-([\w-]+)$/.exec(node.className);
  node.removeAttribute("class");
  if (language) node.className = `language-${language[1]}`;
  if (node.tagName === "IMG") {
    const src = node.getAttribute("src");
    node.removeAttribute("src");
    node.removeAttribute("srcset");
    if (src) node.setAttribute(SRC, src);
  }
  if (node.tagName === "A" && node.hasAttribute("href")) {
    const href = node.getAttribute("href");
    const file = sessionFile(href);
    node.removeAttribute("href");
    node.removeAttribute("target");
    if (file) {
      node.setAttribute(FILE, file);
      node.setAttribute("href", "#");
    } else if (isOutsideLink(href)) {
      node.setAttribute("href", href);
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
  }
});

const SANITIZE = {
  RETURN_DOM_FRAGMENT: true,
  ALLOW_DATA_ATTR: false,
  FORBID_TAGS: [
    "style", "form", "input", "button", "textarea", "select", "option", "iframe", "frame",
    "object", "embed", "svg", "math", "video", "audio", "source", "track", "picture", "link",
    "meta", "base", "dialog", "template",
  ],
  FORBID_ATTR: ["style", "srcset", "formaction", "action", "autofocus", "tabindex"],
};

/** A <code> highlighted by highlight.js (which escapes the text), plain for other languages. */
function highlighted(text, language) {
  const code = document.createElement("code");
  const known = LANGUAGES[language];
  if (known) {
    code.innerHTML = hljs.highlight(text, { language: known, ignoreIllegals: true }).value;
    code.classList.add("hljs");
  } else {
    code.textContent = text;
  }
  return code;
}

export function codeBlock(text, language) {
  const pre = document.createElement("pre");
  pre.append(highlighted(text, language));
  return pre;
}

// The tags the interpreter spec's own web client reads (SANDBANK_AGENT_ANSWER_FORMAT=tags):
// <png>name</png> becomes an image of the session's file; <md> and <plotly> become links that
// download the file (no Plotly JS is vendored, so a figure is offered as its JSON).
const TAG = /<(png|md|plotly)>([^<>\n]*?)<\/\1>/g;
const TAG_LABEL = { md: "Markdown file", plotly: "Plotly figure, JSON" };
const FENCE = /^ {0,3}(```|~~~)/;
const CODE_SPAN = /(`+[^`]*`+)/;
const markdownText = (text) => text.replace(/[\\`*_[\]()<>!]/g, "\\$&");

function tagAsMarkdown(whole, tag, raw) {
  const name = sessionFile(raw.trim());
  if (name === null) return whole; // shown as the text it is
  const label = markdownText(name);
  if (tag === "png") return `![${label}](<${name}>)`;
  return `[${label} (${TAG_LABEL[tag]})](<${name}>)`;
}

/** `text` with the spec client's file tags turned into Markdown, outside code. */
export function fromTags(text) {
  let fenced = false;
  const lines = text.split("\n").map((line) => {
    if (FENCE.test(line)) {
      fenced = !fenced;
      return line;
    }
    if (fenced) return line;
    return line
      .split(CODE_SPAN)
      .map((part, i) => (i % 2 ? part : part.replace(TAG, tagAsMarkdown)))
      .join("");
  });
  return lines.join("\n");
}

/**
 * A sanitized fragment for Markdown `text` (file tags too, see `fromTags`). `loadImage(name)`
 * resolves a session file's name to a blob: URL; images naming anything else are replaced by a
 * note and never requested.
 */
export function renderMarkdown(text, loadImage) {
  const html = markdown.parse(fromTags(text));
  const fragment = purifier.sanitize(html, SANITIZE);
  for (const code of fragment.querySelectorAll("pre > code")) {
    const language = /^language-([\w-]+)$/.exec(code.className)?.[1];
    if (language && LANGUAGES[language]) code.replaceWith(highlighted(code.textContent, language));
  }
  for (const table of fragment.querySelectorAll("table")) {
    const wrap = document.createElement("div");
    wrap.className = "table-wrap";
    table.replaceWith(wrap);
    wrap.append(table);
  }
  for (const img of fragment.querySelectorAll("img")) {
    const target = img.getAttribute(SRC);
    img.removeAttribute(SRC);
    const name = sessionFile(target);
    if (name === null) {
      img.replaceWith(note(`(an image from outside this session is not shown: ${img.alt || "no description"})`));
      continue;
    }
    img.classList.add("chart");
    img.dataset.file = name;
    loadImage(name).then(
      (url) => {
        img.src = url;
      },
      (error) => img.replaceWith(note(`(image ${name} could not be shown: ${error.message})`)),
    );
  }
  return fragment;
}

function note(text) {
  const span = document.createElement("span");
  span.className = "note";
  span.textContent = text;
  return span;
}

/** The session file a rendered link points to (see the sanitizer hook), or null. */
export function linkedFile(anchor) {
  return anchor.getAttribute(FILE);
}
