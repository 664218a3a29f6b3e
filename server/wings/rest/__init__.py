"""The REST wing: the MCP tools as JSON endpoints at /api/v1 of an HTTP server, with an OpenAPI
document (`endpoints.mount_rest`, which the core's HTTP server mounts through
canopy.server.wings). Its extra, [rest], adds nothing to the core's dependencies."""
