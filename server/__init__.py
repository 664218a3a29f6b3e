"""The MCP server, the query engines behind its tools, and the `canopy` CLI (design §6)."""
