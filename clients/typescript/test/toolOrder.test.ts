/**
 * The report's tool order and the tool freeze (docs/prompt-cache.md, "A stable tool order",
 * "Freezing the tools"), on a real sidecar keeping a stable order; each test reports under
 * keys of its own.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as dsp from "../src/index.js";
import { failure, toolNames, useSidecar } from "./helpers.js";

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

const RELEASE_HINT = " (release them with tool_freeze RELEASE to change them)";

test("a tool freeze refuses other tools until released", async () => {
  const client = await stable.connect();
  await addTools(client, "bash", "read");
  const keyed = { report: true, reportKey: "freeze-conv" } as const;
  await client.assemble({ ...keyed, toolFreeze: dsp.ToolFreeze.HOLD });
  await addTools(client, "abc");
  const frozen = await failure(client.assemble(keyed));
  assert.deepEqual([frozen.code, frozen.reason, frozen.message], [
    dsp.Code.FAILED_PRECONDITION,
    dsp.Reason.TOOLS_FROZEN,
    'the tools of key "freeze-conv" are frozen since its report 1: tool "abc" would be added' + RELEASE_HINT,
  ]);
  const released = await client.render({ ...keyed, toolFreeze: "release" });
  assert.deepEqual(toolNames(released.assembly), ["bash", "read", "abc"]);
  assert.deepEqual(released.assembly.report?.toolOrder, { kept: true, position: 0, sortedTool: "abc", keptTool: "bash" });
});

test("a tool freeze needs a report and a known value", async () => {
  // a local cache keeps the answer, yet a freeze goes to the sidecar, which refuses it
  const client = await stable.connect({ localCache: true });
  await client.assemble({ scope: "freeze-refused" });
  const unreported = await failure(client.assemble({ scope: "freeze-refused", toolFreeze: "hold" }));
  assert.equal(unreported.reason, dsp.Reason.INVALID_VALUE);
  assert.match(unreported.message, /^tool_freeze needs report = true/);
  const unknown = await failure(client.assemble({ report: true, toolFreeze: "keep" as dsp.ToolFreeze }));
  assert.deepEqual([unknown.reason, unknown.message], [
    dsp.Reason.INVALID_VALUE,
    "toolFreeze must be one of hold, release, not keep",
  ]);
});
