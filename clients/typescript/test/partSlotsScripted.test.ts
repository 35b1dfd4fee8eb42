/**
 * Part slots against a scripted sidecar: the client reads invocations against the
 * stream's base and replies by slot when `part-slots` is confirmed, fails an invocation
 * it cannot read and listens anew, and sends tool slots alone when it is not.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import * as pb from "../src/gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { waitFor } from "./helpers.js";
import { Script, useScripted, wireTool } from "./scripted.js";

const harness = useScripted();

class PartSlots extends Script {
  override listenerFeatures = ["tool-slots", "part-slots"];
}

function invocation(
  id: number,
  slots: pb.PartSlots | undefined,
  assembly: MessageInitShape<typeof pb.PromptAssemblySchema> = {},
): pb.ListenResponse {
  return create(pb.ListenResponseSchema, {
    kind: { case: "invocation", value: { invocationId: BigInt(id), assembly, slots } },
  });
}

test("the client reads invocations against its base and replies by slot", async () => {
  const script = harness.use(new PartSlots());
  const seen: string[][] = [];
  const client = await harness.connect();
  await client.onAssemble(async (assembly, _context, next) => {
    seen.push(assembly.tools.map((tool) => tool.name));
    assembly.tools.shift();
    return next();
  });
  const stream = script.listeners[0]!;
  stream.send(invocation(1, undefined, { tools: [wireTool("a"), wireTool("b")].map((t) => create(pb.ToolSchemaSchema, t)) }));
  const first = await stream.next();
  stream.send(invocation(2, create(pb.PartSlotsSchema, { tools: [1, -1, 0] }), { tools: [create(pb.ToolSchemaSchema, wireTool("c"))] }));
  const second = await stream.next();
  assert.deepEqual(seen, [["a", "b"], ["b", "c", "a"]]);
  assert.ok(first.kind.case === "next" && second.kind.case === "next");
  assert.deepEqual(first.kind.value.slots?.tools, [1]);
  assert.deepEqual(first.kind.value.assembly?.tools, []);
  assert.deepEqual(second.kind.value.slots?.tools, [1, 2]);
  assert.deepEqual(second.kind.value.toolSlots, []);
});

test("the client that cannot read an invocation fails it and listens anew", async () => {
  const script = harness.use(new PartSlots());
  const client = await harness.connect();
  await client.onAssemble(async (_assembly, _context, next) => next());
  script.listeners[0]!.send(invocation(1, create(pb.PartSlotsSchema, { tools: [3] })));
  const reply = await script.listeners[0]!.next();
  assert.ok(reply.kind.case === "failure");
  assert.match(reply.kind.value.message, /tool slot 3/);
  await waitFor(() => script.listeners.length === 2, "the listener is installed again");
});

test("the client that reads an invocation with more slots than parts held and sent fails it", async () => {
  const script = harness.use(new PartSlots());
  const client = await harness.connect();
  await client.onAssemble(async (_assembly, _context, next) => next());
  const stream = script.listeners[0]!;
  stream.send(invocation(1, undefined, { tools: [create(pb.ToolSchemaSchema, wireTool("a"))] })); // the base: one tool
  await stream.next();
  stream.send(invocation(2, create(pb.PartSlotsSchema, { tools: [0, 0] })));
  const reply = await stream.next();
  assert.ok(reply.kind.case === "failure");
  assert.match(reply.kind.value.message, /2 tool slots, more than the 1 tools held and 0 sent/);
});

test("the client sends tool slots alone to a sidecar without part-slots", async () => {
  const script = harness.use(new Script());
  const client = await harness.connect();
  await client.onAssemble(async (assembly, _context, next) => {
    assembly.sections.splice(1, 1);
    assembly.contexts.splice(0, 1);
    assembly.tools.pop();
    return next();
  });
  const stream = script.listeners[0]!;
  const start = stream.start;
  assert.ok(start?.kind.case === "start" && start.kind.value.features.includes("part-slots")); // offered, not confirmed
  stream.send(
    invocation(1, undefined, {
      sections: ["a", "b", "c"].map((name) => create(pb.AssembledSectionSchema, { name, text: name })),
      contexts: [create(pb.AssembledContextSchema, { name: "c", text: "c" })],
      tools: [wireTool("t0"), wireTool("t1")].map((t) => create(pb.ToolSchemaSchema, t)),
    }),
  );
  const sent = await stream.next();
  assert.ok(sent.kind.case === "next");
  assert.equal(sent.kind.value.slots, undefined);
  assert.deepEqual(sent.kind.value.toolSlots, [0]);
  assert.deepEqual(sent.kind.value.assembly?.sections.map((s) => s.name), ["a", "c"]);
  assert.deepEqual(sent.kind.value.assembly?.contexts, []);
});
