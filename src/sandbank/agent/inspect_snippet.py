"""The Python snippet run INSIDE the sandbox to preview the session's files as one JSON line."""

from __future__ import annotations

# This is code sent to the sandbox, never run by the server: the server does not parse user
# files. Every read is bounded, each file has its own try/except, and the output is capped.
MARKER = "SANDBANK_FILES_JSON:"

_SOURCE = r"""
def _sandbank_inspect(root, marker, max_files=40, max_bytes=65536, max_out=12000):
    import csv, json, os

    def cell(value):
        text = str(value).replace("\n", " ")
        return text if len(text) <= 40 else text[:37] + "..."

    def head(path):
        with open(path, "rb") as handle:
            return handle.read(max_bytes).decode("utf-8", "replace")

    def delimited(path, default):
        text = head(path)
        lines = text.splitlines()
        if len(text) >= max_bytes and len(lines) > 1:
            lines = lines[:-1]  # the last line may be cut
        lines = lines[:5]
        try:
            delimiter = csv.Sniffer().sniff("\n".join(lines), delimiters=",;\t|").delimiter
        except Exception:
            delimiter = default
        rows = list(csv.reader(lines, delimiter=delimiter))
        if not rows:
            return {"kind": "empty"}
        return {"columns": [cell(c) for c in rows[0][:50]],
                "rows": [[cell(c) for c in row[:50]] for row in rows[1:4]]}

    def excel(path, size):
        if size > 50 * 1024 * 1024:
            return {"note": "too large to preview"}
        import openpyxl
        book = openpyxl.load_workbook(path, read_only=True, data_only=True)
        try:
            sheet = book.worksheets[0]
            # Read-only sheets pad every row to max_col with None: keep the used width only.
            raw = [list(row) for row in sheet.iter_rows(max_row=4, max_col=50, values_only=True)]
            width = max([i + 1 for row in raw for i, v in enumerate(row) if v is not None] or [0])
            while raw and all(v is None for v in raw[-1]):
                raw.pop()
            rows = [["" if v is None else cell(v) for v in row[:width]] for row in raw]
            facts = {"sheets": [cell(n) for n in book.sheetnames[:20]]}
            if rows:
                facts["columns"], facts["rows"] = rows[0], rows[1:]
            return facts
        finally:
            book.close()

    def parquet(path):
        import pyarrow.parquet as pq
        source = pq.ParquetFile(path)
        names = source.schema_arrow.names
        facts = {"columns": [cell(n) for n in names[:50]], "row_count": source.metadata.num_rows}
        batch = next(source.iter_batches(batch_size=3, columns=names[:50]), None)
        if batch is not None:
            facts["rows"] = [[cell(v) for v in row.values()] for row in batch.to_pylist()]
        return facts

    def summarize_json(data):
        if isinstance(data, list):
            facts = {"kind": "list", "length": len(data)}
            if data and isinstance(data[0], dict):
                facts["columns"] = [cell(k) for k in list(data[0])[:50]]
                facts["rows"] = [[cell(item.get(k)) for k in list(data[0])[:50]]
                                 for item in data[:3] if isinstance(item, dict)]
            return facts
        if isinstance(data, dict):
            return {"kind": "object", "keys": [cell(k) for k in list(data)[:50]]}
        return {"kind": type(data).__name__}

    def json_file(path, size):
        if size > 2 * 1024 * 1024:
            return {"note": "too large to preview"}
        with open(path, "rb") as handle:
            return summarize_json(json.loads(handle.read()))

    def json_lines(path):
        lines = [line for line in head(path).splitlines()[:4] if line.strip()][:3]
        facts = summarize_json([json.loads(line) for line in lines])
        facts.pop("length", None)  # only the first lines were read
        return facts | {"kind": "json lines"}

    readers = {".csv": lambda p, s: delimited(p, ","), ".tsv": lambda p, s: delimited(p, "\t"),
               ".xlsx": excel, ".xlsm": excel, ".parquet": lambda p, s: parquet(p),
               ".json": json_file, ".jsonl": lambda p, s: json_lines(p),
               ".ndjson": lambda p, s: json_lines(p)}
    found, skipped = [], 0
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        for name in sorted(names):
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root)
            reader = readers.get(os.path.splitext(name)[1].lower())
            if reader is None or os.path.islink(path):
                continue
            if len(found) >= max_files:
                skipped += 1
                continue
            entry = {"name": relative}
            try:
                entry.update(reader(path, os.path.getsize(path)))
            except Exception as error:
                entry["error"] = (type(error).__name__ + ": " + str(error))[:200]
            found.append(entry)
    out = {"files": [], "not_described": skipped}
    for entry in found:
        out["files"].append(entry)
        if len(json.dumps(out)) > max_out:
            out["files"].pop()
            out["not_described"] += 1
    print(marker + json.dumps(out))


try:
    _sandbank_inspect(__ROOT__, __MARKER__)
finally:
    del _sandbank_inspect
"""


def inspect_code(root: str) -> str:
    """The snippet, ready to run with `root` as the directory to look at."""
    return _SOURCE.replace("__ROOT__", repr(root)).replace("__MARKER__", repr(MARKER))
