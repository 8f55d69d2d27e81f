"""The agent: answers questions about a session's data by writing and running code."""
