// Drive `sshadapter mcp` as a task host would, with the official TypeScript SDK's task
// client (@modelcontextprotocol/sdk 1.32, client.experimental.tasks: 2025-11-25 tasks).
//
//   node drive_tasks.mjs '{"command": ["python", "-m", "sshadapter.cli", "mcp", ...],
//                          "name": "...", "arguments": {...}, "ttl": 60000,
//                          "cancel": false}'
//
// Calls the tool as a task (callToolStream with a task TTL and a progress handler) and
// prints one JSON line per step, so the test can act between them: "created" (the task),
// "status" (each tasks/get the stream polls), then either "result" and the calls after it
// (tasks/get, tasks/result again, tasks/list), or, with "cancel": after reading one line
// on stdin, "cancelled" (tasks/cancel's answer), the stream's end and tasks/result after it.
// Every progress notification is printed as "progress". An error is a step too.
import process from "node:process";
import readline from "node:readline";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";

const spec = JSON.parse(process.argv[2]);
const [command, ...args] = spec.command;
const say = (step) => process.stdout.write(JSON.stringify(step) + "\n");
const failure = (error) => ({ code: error.code ?? null, message: String(error.message) });
const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();

const client = new Client({ name: "sshadapter-test-tasks", version: "1.0.0" });
const transport = new StdioClientTransport({ command, args, stderr: "inherit", env: process.env });
await client.connect(transport);
say({ step: "connected", capabilities: client.getServerCapabilities() });
await client.listTools(); // the SDK learns each tool's outputSchema and taskSupport
const tasks = client.experimental.tasks;

const stream = tasks.callToolStream({ name: spec.name, arguments: spec.arguments }, CallToolResultSchema, {
  task: { ttl: spec.ttl },
  onprogress: (progress) => say({ step: "progress", progress }),
});
let taskId;
for await (const message of stream) {
  if (message.type === "taskCreated") {
    taskId = message.task.taskId;
    say({ step: "created", task: message.task });
    if (spec.cancel) {
      await lines.next(); // the test saw the approval pending
      say({ step: "cancelled", answer: await tasks.cancelTask(taskId) });
    }
  } else if (message.type === "taskStatus") {
    say({ step: "status", task: message.task });
  } else if (message.type === "result") {
    say({ step: "result", result: message.result });
  } else {
    say({ step: "end", error: failure(message.error) });
  }
}
if (taskId !== undefined) {
  try {
    say({ step: "get", task: await tasks.getTask(taskId) });
    say({ step: "again", result: await tasks.getTaskResult(taskId, CallToolResultSchema) });
  } catch (error) {
    say({ step: "after", error: failure(error) });
  }
  say({ step: "list", tasks: (await tasks.listTasks()).tasks });
}
await client.close();
process.exit(0);
