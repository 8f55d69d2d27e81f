// Display bundles of tool calls (`display(df)`, a figure, an echoed value) as inert DOM: HTML is
// parsed in an inert template and rebuilt here from an allow-list (tables survive; scripts,
// styles, frames, handlers, links and every outside resource do not); images become blob: URLs
// in <img> (an SVG is never inlined as markup); Markdown goes through render.js; text stays text.

import { renderMarkdown } from "./render.js";

// Elements rebuilt as themselves; any other is dropped but its children are kept...
const ALLOWED = new Set([
  "table", "thead", "tbody", "tfoot", "tr", "th", "td", "caption", "colgroup", "col",
  "p", "div", "span", "br", "hr", "b", "i", "strong", "em", "u", "s", "small", "sub", "sup",
  "code", "pre", "kbd", "samp", "var", "ul", "ol", "li", "dl", "dt", "dd", "blockquote",
  "h1", "h2", "h3", "h4", "h5", "h6",
]);
// ...except these, dropped with everything inside them.
const DROPPED = new Set([
  "script", "style", "iframe", "frame", "frameset", "object", "embed", "applet", "template",
  "noscript", "svg", "math", "link", "meta", "base", "form", "input", "button", "select",
  "textarea", "audio", "video", "source", "picture", "img", "image", "canvas", "title", "head",
]);
// Attributes kept (on any allowed element), each only with a plain value.
const ATTRIBUTES = { colspan: /^\d{1,3}$/, rowspan: /^\d{1,3}$/, align: /^(left|right|center)$/i, title: /^/ };
const IMAGES = ["image/png", "image/jpeg", "image/svg+xml"];
const MAX_DEPTH = 64; // deeper markup is cut, not recursed into

/** The HTML of an untrusted display as a fragment of clean, new elements of this document. */
export function sanitizeHtml(html) {
  // A template's content is parsed inert and never connected: nothing in it loads, runs or
  // applies (a DOMParser document would still apply the page's CSP to its <style>s, and
  // report each as a violation). Its nodes are only read, never inserted.
  const template = document.createElement("template");
  template.innerHTML = renameInline(String(html));
  const fragment = document.createDocumentFragment();
  copyChildren(template.content, fragment, 0);
  return fragment;
}

/** `onclick=`, `style=` and the like renamed in every tag before parsing: the parser would have
 * the page's CSP refuse each (a console error each time: pandas puts `style="text-align:
 * right;"` on every table) though none could ever apply. Only noise goes: the allow-list below
 * is what keeps them out, whatever this misses. */
function renameInline(html) {
  return html.replace(/<[a-z][^>]*>/gi, (tag) =>
    tag
      .replace(/([\s/"'])on(?=[a-z-]*\s*(?:=|[\s/>]))/gi, "$1data-sb-on")
      .replace(/([\s/"'])style(?=\s*(?:=|[\s/>]))/gi, "$1data-sb-style"),
  );
}

function copyChildren(from, to, depth) {
  if (depth > MAX_DEPTH) return;
  for (const node of from.childNodes) {
    if (node.nodeType === Node.TEXT_NODE) {
      to.append(document.createTextNode(node.data));
      continue;
    }
    if (node.nodeType !== Node.ELEMENT_NODE) continue; // comments, processing instructions
    const tag = node.localName;
    if (DROPPED.has(tag)) continue;
    if (!ALLOWED.has(tag)) {
      copyChildren(node, to, depth + 1);
      continue;
    }
    const clean = document.createElement(tag);
    for (const [name, pattern] of Object.entries(ATTRIBUTES)) {
      const value = node.getAttribute(name);
      if (value !== null && pattern.test(value)) clean.setAttribute(name, value);
    }
    copyChildren(node, clean, depth + 1);
    to.append(clean);
  }
}

function imageOf(media, value) {
  let blob;
  if (media === "image/svg+xml") {
    blob = new Blob([String(value)], { type: media });
  } else {
    try {
      const bytes = Uint8Array.from(atob(String(value)), (c) => c.charCodeAt(0));
      blob = new Blob([bytes], { type: media });
    } catch {
      return null; // not base64: nothing to show
    }
  }
  const url = URL.createObjectURL(blob);
  const img = document.createElement("img");
  img.alt = "a displayed image";
  img.addEventListener("load", () => URL.revokeObjectURL(url), { once: true });
  img.addEventListener("error", () => URL.revokeObjectURL(url), { once: true });
  img.src = url;
  return img;
}

/** One bundle as a notebook shows it: its richest form this page can show safely. */
export function displayBundle(bundle, resolveImage) {
  const data = (bundle && typeof bundle.data === "object" && bundle.data) || {};
  const box = document.createElement("div");
  box.className = "display";
  if (typeof data["text/html"] === "string") {
    box.classList.add("display-html");
    box.append(sanitizeHtml(data["text/html"]));
  } else if (IMAGES.some((m) => typeof data[m] === "string")) {
    const media = IMAGES.find((m) => typeof data[m] === "string");
    const img = imageOf(media, data[media]);
    if (img) box.append(img);
  } else if (typeof data["text/markdown"] === "string") {
    box.append(renderMarkdown(data["text/markdown"], resolveImage));
  } else {
    const pre = document.createElement("pre");
    pre.textContent = typeof data["text/plain"] === "string" ? data["text/plain"] : "";
    box.append(pre);
  }
  if (Array.isArray(bundle?.cut) && bundle.cut.length) {
    const note = document.createElement("p");
    note.className = "muted";
    note.textContent = `Too large to show: ${bundle.cut.map(String).join(", ")}`;
    box.append(note);
  }
  return box;
}
