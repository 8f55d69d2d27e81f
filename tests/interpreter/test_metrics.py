"""The interpreter API's file metrics move as files are uploaded, produced and downloaded."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.interpreter.fake_llm import FakeLLM
from tests.interpreter.harness import Server, openai_env, running


def samples(server: Server) -> dict[tuple[str, str], float]:
    text = httpx.get(f"{server.url}/metrics").text
    return {
        (s.name, s.labels.get("op", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("sandbank_file")
    }


def test_uploads_produced_files_and_downloads_are_counted(llm: FakeLLM, machine: None) -> None:
    with running(openai_env(llm.url)) as server, server.new_user() as carol:
        sid = carol.new_session()
        assert carol.upload(sid, "notes.txt", b"n" * 1000).status_code == 204
        carol.ask(sid, "Write a page")
        assert carol.wait(sid)["status"] == "DONE"
        files = {f["filename"]: f["size"] for f in carol.ok("GET", f"/api/sessions/{sid}/files")}
        carol.ok("GET", f"/api/sessions/{sid}/files/download", params={"filename": "page.html"})
        got = samples(server)
    assert got[("sandbank_files_total", "upload")] == 1
    assert got[("sandbank_file_bytes_total", "upload")] == 1000
    assert got[("sandbank_files_total", "produced")] == 1
    assert got[("sandbank_file_bytes_total", "produced")] == files["page.html"] > 0
    assert got[("sandbank_files_total", "download")] == 1
    assert got[("sandbank_file_bytes_total", "download")] == files["page.html"]
