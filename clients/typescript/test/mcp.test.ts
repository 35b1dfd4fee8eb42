/**
 * The MCP tools bridge (`@dsh/system-prompt/mcp`) over a real MCP server: the SDK's stdio
 * client and a server on its own McpServer (test/fixtures/mcpServer.ts), against a real
 * sidecar. Each change the server makes arrives as `notifications/tools/list_changed` on the
 * client the bridge was given, as in an agent.
 */

import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import { Client as McpClient } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import * as dsp from "../src/index.js";
import { MAX_PAGES, McpTools, canonicalJson } from "../src/mcp.js";
import { toolNames, useSidecar } from "./helpers.js";

const harness = useSidecar();
const SERVER = fileURLToPath(new URL("./fixtures/mcpServer.js", import.meta.url));
const OWN = ["mcp__fs__add_tool", "mcp__fs__echo", "mcp__fs__remove_tool", "mcp__fs__reverse_keys"];
const IDENTITY = "You are an AI agent powered by DeepSeek Harness.";

/** A connected MCP client of a fresh test server started with `args`; closing it stops the server. */
async function serve(...args: string[]): Promise<McpClient> {
  const client = new McpClient({ name: "agent", version: "1.0.0" });
  await client.connect(new StdioClientTransport({ command: process.execPath, args: [SERVER, ...args], stderr: "ignore" }));
  return client;
}

function parametersJson(assembly: dsp.PromptAssembly): Record<string, string> {
  return Object.fromEntries(
    assembly.tools.map((tool) => {
      assert.ok(tool instanceof dsp.ToolSchema);
      return [tool.name, tool.parametersJson() ?? ""];
    }),
  );
}

async function nextEvent(changes: dsp.ChangeStream): Promise<dsp.ChangeEvent> {
  const item = await changes.next();
  assert.ok(!item.done && item.value.type === "change", `a change event, not ${JSON.stringify(item.value)}`);
  return item.value;
}

test("the tools are one labelled registration with canonical schemas", async () => {
  const client = await harness.connect();
  const bridge = new McpTools(client, "fs");
  const mcp = await serve();
  try {
    await bridge.attach(mcp);
    const assembly = await client.assemble();
    const listed = (await mcp.listTools()).tools.find((tool) => tool.name === "echo");
    assert.deepEqual(toolNames(assembly), OWN);
    const echo = parametersJson(assembly)["mcp__fs__echo"] ?? "";
    assert.equal(echo, canonicalJson(listed?.inputSchema));
    assert.deepEqual(JSON.parse(echo), listed?.inputSchema);
    assert.ok(echo.startsWith('{"$schema":'), echo);
    assert.notEqual(echo, JSON.stringify(listed?.inputSchema)); // the server's own order differs
    const snapshot = await client.snapshot();
    assert.deepEqual(
      snapshot.registrations.filter((info) => info.kind === "tools").map((info) => info.name),
      ["mcp:fs"],
    );
  } finally {
    await bridge.dispose();
    await mcp.close();
  }
});

test("keys in another order change nothing", async () => {
  const client = await harness.connect();
  const bridge = new McpTools(client, "fs");
  const mcp = await serve();
  try {
    await bridge.attach(mcp);
    const before = parametersJson(await client.assemble());
    const sentBefore = (await mcp.listTools()).tools.map((tool) => JSON.stringify(tool.inputSchema));
    const changes = await client.watchChanges();
    await mcp.callTool({ name: "reverse_keys", arguments: {} });
    await bridge.settled();
    assert.equal(bridge.listings, 2); // the notification was followed: the server was asked
    const sentAfter = (await mcp.listTools()).tools.map((tool) => JSON.stringify(tool.inputSchema));
    assert.notDeepEqual(sentAfter, sentBefore); // the server did send other bytes
    assert.deepEqual(parametersJson(await client.assemble()), before);
    await client.section("marker", 1, "x"); // the next event is the marker's: the re-listing sent none
    const event = await nextEvent(changes);
    assert.deepEqual([event.kind, event.name], ["section", "marker"]);
    changes.close();
  } finally {
    await bridge.dispose();
    await mcp.close();
  }
});

test("a tool added then removed is one update each", async () => {
  const client = await harness.connect();
  const bridge = new McpTools(client, "fs");
  const mcp = await serve();
  try {
    await bridge.attach(mcp);
    const changes = await client.watchChanges();
    await mcp.callTool({ name: "add_tool", arguments: { name: "abc" } });
    const added = await nextEvent(changes);
    const withAbc = await client.assemble();
    await mcp.callTool({ name: "remove_tool", arguments: { name: "abc" } });
    const removed = await nextEvent(changes);
    const without = await client.assemble();
    await bridge.settled();
    await client.section("marker", 1, "x");
    const marker = await nextEvent(changes);
    for (const event of [added, removed]) {
      assert.deepEqual([event.kind, event.action, event.name], ["tools", "updated", "mcp:fs"]);
    }
    assert.deepEqual(toolNames(withAbc), ["mcp__fs__abc", ...OWN]);
    assert.deepEqual(toolNames(without), OWN);
    assert.equal(marker.name, "marker");
    changes.close();
  } finally {
    await bridge.dispose();
    await mcp.close();
  }
});

test("a restarted server is listed again", async () => {
  const client = await harness.connect();
  const bridge = new McpTools(client, "fs");
  try {
    let mcp = await serve("--extra", "grep");
    await bridge.attach(mcp);
    const first = parametersJson(await client.assemble());
    await mcp.close();
    const changes = await client.watchChanges();
    // The same tools, keys in another order: the reconnect changes nothing.
    mcp = await serve("--extra", "grep", "--reversed");
    await bridge.attach(mcp);
    assert.deepEqual(parametersJson(await client.assemble()), first);
    await mcp.close();
    // Restarted with another tool set: one update.
    mcp = await serve("--extra", "glob");
    await bridge.attach(mcp);
    const event = await nextEvent(changes);
    const assembly = await client.assemble();
    await mcp.close();
    assert.equal(bridge.listings, 3);
    assert.deepEqual([event.kind, event.action, event.name], ["tools", "updated", "mcp:fs"]);
    assert.ok("mcp__fs__grep" in first);
    assert.deepEqual(toolNames(assembly), ["mcp__fs__add_tool", "mcp__fs__echo", "mcp__fs__glob", ...OWN.slice(2)]);
    changes.close();
  } finally {
    await bridge.dispose();
  }
});

test("instructions holding braces render as written", async () => {
  const client = await harness.connect();
  const bridge = new McpTools(client, "my-fs");
  const instructions = "Read {{x}} as written; {{ y }} and {{{z}}} too.";
  try {
    let mcp = await serve("--instructions", instructions);
    await bridge.attach(mcp);
    const rendered = await client.render();
    const local = dsp.renderPrompt(await client.assemble());
    await mcp.close();
    mcp = await serve("--instructions", "Now {{other}}.");
    await bridge.attach(mcp);
    const again = await client.render();
    await mcp.close();
    assert.equal(bridge.variable, "mcp_my_fs_instructions");
    assert.equal(rendered.prompt, `${IDENTITY}\n\n${instructions}`);
    assert.equal(local, rendered.prompt);
    assert.equal(again.prompt, `${IDENTITY}\n\nNow {{other}}.`);
  } finally {
    await bridge.dispose();
  }
});

test("dispose removes everything it registered, and a failed first attach leaves nothing", async () => {
  const client = await harness.connect();
  const bridge = new McpTools(client, "fs");
  const mcp = await serve("--instructions", "be careful");
  try {
    await bridge.attach(mcp);
    await bridge.dispose();
    await mcp.callTool({ name: "add_tool", arguments: { name: "late" } }); // no longer followed
    await bridge.settled();
    assert.equal(bridge.listings, 1);
    let assembly = await client.assemble();
    assert.deepEqual(assembly.tools, []);
    assert.ok(!assembly.sections.some((section) => section.name === "mcp:fs"));

    await client.variable("mcp_fs_instructions", "taken");
    const again = new McpTools(client, "fs");
    await assert.rejects(again.attach(mcp), /already registered/);
    assembly = await client.assemble();
    assert.deepEqual(assembly.tools, []);
  } finally {
    await mcp.close();
  }
});

test("a listing in pages is followed to its end", async () => {
  const client = await harness.connect();
  const bridge = new McpTools(client, "fs");
  const mcp = await serve("--page-size", "1");
  try {
    const firstPage = await mcp.listTools();
    await bridge.attach(mcp);
    assert.equal(firstPage.tools.length, 1);
    assert.equal(firstPage.nextCursor, "1");
    assert.deepEqual(toolNames(await client.assemble()), OWN);
  } finally {
    await bridge.dispose();
    await mcp.close();
  }
});

test("a server paging forever is refused after MAX_PAGES", async () => {
  const client = await harness.connect();
  const bridge = new McpTools(client, "fs");
  const mcp = await serve("--endless");
  try {
    await assert.rejects(bridge.attach(mcp), new RegExp(`still had a next page after ${MAX_PAGES} pages`));
    const assembly = await client.assemble();
    assert.deepEqual(assembly.tools, []);
    assert.ok(!assembly.sections.some((section) => section.name === "mcp:fs"));
  } finally {
    await mcp.close();
  }
});
