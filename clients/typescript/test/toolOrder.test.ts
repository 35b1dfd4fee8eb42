/**
 * The report's tool order (docs/prompt-cache.md, "A stable tool order"), on a real
 * sidecar keeping a stable order; each test reports under keys of its own.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as dsp from "../src/index.js";
import { toolNames, useSidecar } from "./helpers.js";

const stable = useSidecar({ config: ['tool_order_mode = "stable"'] });

/** Register static tools with these names (and no parameters). */
function addTools(client: dsp.Client, ...names: string[]): Promise<dsp.Handle> {
  return client.tools(names.map((name) => ({ name, description: `The ${name} tool.`, parameters: {} })));
}

test("a stable report says where sorting would have broken the tools", async () => {
  const client = await stable.connect();
  await addTools(client, "bash", "read", "write");
  const reported = { report: true, reportKey: "order-conv" } as const;
  const first = await client.assemble(reported);
  assert.deepEqual(first.report?.toolOrder, { kept: false, position: 0, sortedTool: "", keptTool: "" });
  await addTools(client, "mcp__fs__abc");
  const second = await client.assemble(reported);
  assert.deepEqual(second.report?.toolOrder, { kept: true, position: 1, sortedTool: "mcp__fs__abc", keptTool: "read" });
  assert.deepEqual(toolNames(second), ["bash", "read", "write", "mcp__fs__abc"]);
});
