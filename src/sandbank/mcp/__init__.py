"""The Model Context Protocol door: Sandbank's sandboxes as MCP tools and resources.

tools.py     what a model reads: each tool's name, description and input schema
door.py      the MCP server's handlers over the sandbox port (one port call per tool)
sessions.py  who calls (tenant, client identity) and their default sessions
results.py   a call's result as MCP content: text, images, links to produced files
http.py      streamable HTTP at /mcp behind the code-execution API's bearer tokens
stdio.py     `sandbank mcp`: the same door over stdin/stdout
"""
