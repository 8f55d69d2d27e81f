// The API reference: both OpenAPI documents this server serves, rendered as text nodes only
// (descriptions are shown as plain text, never as HTML), under the page's strict CSP.

const DOCUMENTS = [
  { id: "exec", url: "openapi.json", name: "Code-execution API" },
  { id: "api", url: "api/openapi.json", name: "Interpreter API" },
];
const METHODS = ["get", "put", "post", "delete", "patch", "head", "options"];
const MAX_DEPTH = 6;

function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") el.className = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined && child !== false) el.append(child);
  }
  return el;
}

/** Follows a local `$ref` ("#/components/...") in `doc`; null when it points elsewhere. */
function resolve(doc, ref) {
  if (typeof ref !== "string" || !ref.startsWith("#/")) return null;
  let node = doc;
  for (const part of ref.slice(2).split("/")) {
    node = node?.[part.replace(/~1/g, "/").replace(/~0/g, "~")];
  }
  return node ?? null;
}

const anchor = (docId, kind, name) => `${docId}-${kind}-${name}`.replace(/[^A-Za-z0-9_-]/g, "_");

function text(value) {
  return h("p", { class: "doc-text" }, String(value ?? "").trim());
}

function typeOf(schema) {
  if (!schema || typeof schema !== "object") return "any";
  if (schema.$ref) return schema.$ref.split("/").pop();
  if (Array.isArray(schema.type)) return schema.type.join(" | ");
  if (schema.type === "array") return `array of ${typeOf(schema.items)}`;
  if (schema.enum) return `one of ${schema.enum.map((v) => JSON.stringify(v)).join(", ")}`;
  if (schema.const !== undefined) return JSON.stringify(schema.const);
  for (const key of ["oneOf", "anyOf", "allOf"]) {
    if (Array.isArray(schema[key])) return schema[key].map(typeOf).join(key === "allOf" ? " & " : " | ");
  }
  return schema.type ?? (schema.properties ? "object" : "any");
}

/** A schema as a nested list: each property with its type, whether required, its description. */
function schemaView(doc, docId, schema, depth = 0) {
  if (!schema || typeof schema !== "object") return h("span", { class: "muted" }, "any");
  if (schema.$ref) {
    const name = schema.$ref.split("/").pop();
    return h("a", { href: `#${anchor(docId, "schema", name)}` }, name);
  }
  const head = h("span", { class: "type" }, typeOf(schema));
  if (depth >= MAX_DEPTH) return head;
  const parts = [head];
  if (schema.description) parts.push(" — ", h("span", { class: "muted" }, schema.description.trim()));
  if (schema.type === "array" && schema.items && !schema.items.$ref && schema.items.properties) {
    parts.push(schemaView(doc, docId, schema.items, depth + 1));
  }
  const props = schema.properties ?? {};
  const required = new Set(schema.required ?? []);
  if (Object.keys(props).length) {
    parts.push(
      h(
        "ul",
        { class: "props" },
        Object.entries(props).map(([name, sub]) =>
          h(
            "li",
            {},
            h("code", {}, name),
            required.has(name) ? h("span", { class: "required" }, " required") : "",
            ": ",
            schemaView(doc, docId, sub, depth + 1),
          ),
        ),
      ),
    );
  }
  for (const key of ["oneOf", "anyOf", "allOf"]) {
    if (Array.isArray(schema[key]) && schema[key].some((s) => s.properties || s.$ref)) {
      parts.push(h("ul", { class: "props" }, schema[key].map((s) => h("li", {}, schemaView(doc, docId, s, depth + 1)))));
    }
  }
  return h("div", { class: "schema" }, parts);
}

function contentView(doc, docId, content) {
  return Object.entries(content ?? {}).map(([type, media]) =>
    h("div", { class: "media" }, h("code", {}, type), " ", schemaView(doc, docId, media.schema)),
  );
}

function operationView(doc, docId, path, method, op) {
  const params = [...(doc.paths[path].parameters ?? []), ...(op.parameters ?? [])].map((p) => (p.$ref ? resolve(doc, p.$ref) : p));
  const section = h(
    "section",
    { class: "operation card", id: anchor(docId, "op", `${method}-${path}`) },
    h("h3", {}, h("span", { class: `method method-${method}` }, method.toUpperCase()), " ", h("code", {}, path)),
    op.summary ? h("p", { class: "summary" }, op.summary) : "",
    op.description ? text(op.description) : "",
  );
  if (params.length) {
    section.append(
      h("h4", {}, "Parameters"),
      h(
        "ul",
        { class: "props" },
        params.filter(Boolean).map((p) =>
          h("li", {}, h("code", {}, p.name), ` (${p.in}${p.required ? ", required" : ""}): `, schemaView(doc, docId, p.schema), p.description ? h("span", { class: "muted" }, ` — ${p.description.trim()}`) : ""),
        ),
      ),
    );
  }
  const body = op.requestBody?.$ref ? resolve(doc, op.requestBody.$ref) : op.requestBody;
  if (body) {
    section.append(h("h4", {}, "Request body"), body.description ? text(body.description) : "", ...contentView(doc, docId, body.content));
  }
  section.append(
    h("h4", {}, "Responses"),
    h(
      "ul",
      { class: "responses" },
      Object.entries(op.responses ?? {}).map(([status, response]) => {
        const r = response.$ref ? resolve(doc, response.$ref) ?? {} : response;
        return h("li", {}, h("strong", {}, status), " ", String(r.description ?? "").trim(), contentView(doc, docId, r.content));
      }),
    ),
  );
  return section;
}

function documentView(doc, spec) {
  const ops = [];
  const toc = h("ul", { class: "toc" });
  for (const [path, item] of Object.entries(doc.paths ?? {})) {
    for (const method of METHODS) {
      if (!item[method]) continue;
      ops.push(operationView(doc, spec.id, path, method, item[method]));
      toc.append(h("li", {}, h("a", { href: `#${anchor(spec.id, "op", `${method}-${path}`)}` }, `${method.toUpperCase()} ${path}`), item[method].summary ? ` — ${item[method].summary}` : ""));
    }
  }
  const schemas = Object.entries(doc.components?.schemas ?? {}).map(([name, schema]) =>
    h("section", { class: "schema-def card", id: anchor(spec.id, "schema", name) }, h("h3", {}, h("code", {}, name)), schemaView(doc, spec.id, { ...schema, $ref: undefined })),
  );
  return h(
    "section",
    { class: "document", id: spec.id },
    h("h2", {}, `${spec.name}: ${doc.info?.title ?? ""} ${doc.info?.version ?? ""}`.trim()),
    h("p", {}, "The document itself: ", h("a", { href: spec.url }, spec.url)),
    doc.info?.description ? text(doc.info.description) : "",
    h("h3", {}, "Operations"),
    toc,
    ops,
    schemas.length ? [h("h3", {}, "Schemas"), ...schemas] : "",
  );
}

async function main() {
  const root = document.getElementById("reference");
  const nav = h("p", {}, DOCUMENTS.flatMap((d, i) => [i ? " · " : "", h("a", { href: `#${d.id}` }, d.name)]));
  root.append(nav);
  let served = DOCUMENTS.map((d) => d.url);
  try {
    const config = await (await fetch(new URL("ui/config.json", document.baseURI), { cache: "no-store" })).json();
    if (Array.isArray(config.documents)) served = config.documents;
  } catch {
    // Ask for both; the missing one says so.
  }
  for (const spec of DOCUMENTS) {
    if (!served.includes(spec.url)) {
      root.append(h("section", { class: "document", id: spec.id }, h("h2", {}, spec.name), h("p", { class: "muted" }, "Not served on this listener.")));
      continue;
    }
    try {
      const response = await fetch(new URL(spec.url, document.baseURI), { cache: "no-store" });
      if (!response.ok) throw new Error(`not served here (${response.status})`);
      root.append(documentView(await response.json(), spec));
    } catch (error) {
      root.append(h("section", { class: "document", id: spec.id }, h("h2", {}, spec.name), h("p", { class: "muted" }, `Not available: ${error.message}`)));
    }
  }
  if (location.hash) document.getElementById(location.hash.slice(1))?.scrollIntoView();
}

main();
