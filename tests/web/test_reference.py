"""The API reference page: both OpenAPI documents rendered by our viewer, under the strict CSP."""

from __future__ import annotations

from playwright.sync_api import expect

from tests.web.conftest import Tab


def test_both_documents_are_rendered_and_linked_from_the_page(tab: Tab) -> None:
    page = tab.page
    page.goto(tab.base_url + "/")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.get_by_role("link", name="API reference").click()
    expect(page.get_by_role("heading", name="API reference", exact=True)).to_be_visible()
    exec_doc = page.locator("section.document#exec")
    expect(exec_doc.locator("h2")).to_contain_text("Code-execution API: Otari code-execution")
    execute = exec_doc.locator("section.operation", has_text="/sessions/{session_id}/exec")
    expect(execute.locator("h3")).to_have_text("POST /sessions/{session_id}/exec")
    expect(execute.locator(".summary")).to_have_text("Run one tool call in a session")
    expect(execute.get_by_role("link", name="ExecRequest")).to_be_visible()
    request = exec_doc.locator("section.schema-def#exec-schema-ExecRequest")
    request.get_by_role("link", name="CodeExecutionRequest").click()
    python = exec_doc.locator("section.schema-def#exec-schema-CodeExecutionRequest")
    expect(python).to_be_in_viewport()
    expect(python).to_contain_text("tool required")
    api_doc = page.locator("section.document#api")
    expect(api_doc.locator("h2")).to_contain_text("Interpreter API: Code Interpreter REST API")
    expect(api_doc.locator("section.operation h3").first).to_contain_text("/api/sessions")
    tab.shot("api-reference")
    assert tab.console.unexpected() == []
