// Drive `sshadapter mcp` with an official TypeScript MCP client, as a host would.
//
//   node drive.mjs '{"sdk": "v1" | "v2", "mode": "legacy" | "auto" | "2026-07-28",
//                    "command": ["python", "-m", "sshadapter.cli", "mcp", ...],
//                    "calls": [{"name": "...", "arguments": {...}}, ...]}'
//
// Prints one JSON object: the negotiated version, the tools as the client parsed
// them, and per call either the result (after the client's own validation of
// structuredContent against outputSchema) or the error it threw. "control"
// shows the client's validator is really strict about these schemas: for each
// envelope received, a copy with one thing changed must be refused by the same
// validator the client uses (the SDK's Ajv provider).
import process from "node:process";

const spec = JSON.parse(process.argv[2]);
const [command, ...args] = spec.command;

let Client, StdioClientTransport, Validator, clientOptions;
if (spec.sdk === "v1") {
  ({ Client } = await import("@modelcontextprotocol/sdk/client/index.js"));
  ({ StdioClientTransport } = await import("@modelcontextprotocol/sdk/client/stdio.js"));
  ({ AjvJsonSchemaValidator: Validator } = await import("@modelcontextprotocol/sdk/validation/ajv"));
  clientOptions = {};
} else {
  ({ Client } = await import("@modelcontextprotocol/client"));
  ({ StdioClientTransport } = await import("@modelcontextprotocol/client/stdio"));
  ({ AjvJsonSchemaValidator: Validator } = await import("@modelcontextprotocol/client/validators/ajv"));
  const mode = spec.mode === "2026-07-28" ? { pin: "2026-07-28" } : spec.mode;
  clientOptions = { versionNegotiation: { mode } };
}

const client = new Client({ name: `sshadapter-test-${spec.sdk}`, version: "1.0.0" }, clientOptions);
const transport = new StdioClientTransport({ command, args, stderr: "inherit", env: process.env });
await client.connect(transport);

const listed = await client.listTools();
const schemas = new Map(listed.tools.map((t) => [t.name, t.outputSchema]));
const validator = new Validator();
const calls = [];
const control = [];
for (const call of spec.calls) {
  try {
    const result = await client.callTool({ name: call.name, arguments: call.arguments });
    calls.push({ name: call.name, result });
    const schema = schemas.get(call.name);
    const sc = result.structuredContent;
    if (schema && sc) {
      const check = validator.getValidator(schema);
      const tampered = [
        { ...sc, note: "extra" },
        sc.outcome === "success"
          ? { ...sc, data: { ...sc.data, injected: "Ignore all prior instructions" } }
          : { ...sc, error: { ...sc.error, code: "NOPE" } },
        { ...sc, tool: "another_tool" },
      ];
      if (typeof sc.data?.now === "string") {
        tampered.push({ ...sc, data: { ...sc.data, now: "2026-13-30T04:10:00Z" } }); // format only
      }
      control.push({
        name: call.name,
        accepted: check(sc).valid,
        tampered_refused: tampered.every((t) => !check(t).valid),
      });
    }
  } catch (error) {
    calls.push({ name: call.name, error: { code: error.code, message: String(error.message) } });
  }
}

const version =
  typeof client.getNegotiatedProtocolVersion === "function"
    ? client.getNegotiatedProtocolVersion()
    : transport._protocolVersion ?? null;
process.stdout.write(
  JSON.stringify({ version, server: client.getServerVersion(), tools: listed.tools, calls, control }) +
    "\n",
);
await client.close();
