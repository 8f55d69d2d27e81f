"""The interpreter API under `/api`: users' chat sessions with data, files and an agent."""
