// The official TypeScript MCP SDK as a benchmark upstream: one `echo` tool with an input and an output schema,
// Streamable HTTP, stateful (one transport per Mcp-Session-Id, as the SDK's own examples do), JSON responses.
//
//   node upstream_ts.mjs --port 8092        # serves http://127.0.0.1:8092/mcp
//
// bench/sidebyside.py installs the pinned SDK into bench/.cache/ts (npm) and copies this file next to its
// node_modules before starting it, because Node resolves ESM imports from the script's own directory.
// Plain node:http, no Express: the server's cost should be the SDK's, not a web framework's.

import { randomUUID } from "node:crypto";
import { createServer } from "node:http";

import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

function option(name, fallback) {
  const at = process.argv.indexOf(name);
  return at >= 0 && at + 1 < process.argv.length ? process.argv[at + 1] : fallback;
}

const host = option("--host", "127.0.0.1");
const port = Number(option("--port", "8092"));
const transports = new Map();

function newServer() {
  const server = new McpServer({ name: "upstream-ts", version: "1.0.0" });
  server.registerTool(
    "echo",
    {
      description: "Return the given text.",
      inputSchema: { text: z.string() },
      outputSchema: { text: z.string() },
      annotations: { readOnlyHint: true },
    },
    async ({ text }) => ({ content: [{ type: "text", text }], structuredContent: { text } }),
  );
  return server;
}

async function readJson(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return chunks.length ? JSON.parse(Buffer.concat(chunks).toString("utf8")) : undefined;
}

function fail(res, status, message) {
  res.writeHead(status, { "Content-Type": "application/json" });
  res.end(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32000, message } }));
}

const http = createServer(async (req, res) => {
  try {
    if (!req.url || req.url.split("?")[0] !== "/mcp") return fail(res, 404, "Not found");
    const sid = req.headers["mcp-session-id"];
    const body = req.method === "POST" ? await readJson(req) : undefined;
    let transport = typeof sid === "string" ? transports.get(sid) : undefined;
    if (transport === undefined) {
      if (req.method !== "POST" || sid !== undefined || !isInitializeRequest(body)) {
        return fail(res, sid === undefined ? 400 : 404, "No valid session");
      }
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        enableJsonResponse: true,
        onsessioninitialized: (id) => transports.set(id, transport),
      });
      transport.onclose = () => {
        if (transport.sessionId) transports.delete(transport.sessionId);
      };
      await newServer().connect(transport);
    }
    await transport.handleRequest(req, res, body);
  } catch (error) {
    if (!res.headersSent) fail(res, 500, String(error));
  }
});

http.keepAliveTimeout = 60_000;
http.listen(port, host, () => console.log(`upstream-ts listening on http://${host}:${port}/mcp`));
for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => process.exit(0));
