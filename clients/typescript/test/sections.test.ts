/** Static and dynamic sections, contexts, variables and tools, assembled and rendered. */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import * as dsp from "../src/index.js";
import { IDENTITY, ownSections, toolNames } from "./helpers.js";
import { Sidecar } from "./sidecar.js";

let sidecar: Sidecar;
before(async () => {
  sidecar = await Sidecar.start();
});
after(async () => {
  await sidecar.stop();
});

async function withClient(run: (client: dsp.Client) => Promise<void>): Promise<void> {
  const client = await dsp.connect(sidecar.address);
  try {
    await run(client);
  } finally {
    await client.close();
  }
}

test("static sections are assembled by order after the built-ins", () =>
  withClient(async (client) => {
    await client.section("second", 20, "Two.");
    await client.section("first", 10, "One.");
    const assembly = await client.assemble();
    assert.deepEqual(ownSections(assembly), ["first", "second"]);
    assert.equal(dsp.renderPrompt(assembly), `${IDENTITY}\n\nOne.\n\nTwo.`);
  }));

test("a dynamic section is evaluated at each assembly with the caller's fields", () =>
  withClient(async (client) => {
    await client.section("task", 10, (context) => `Task: ${String(context.fields["task"])}.`);
    const first = await client.assemble({ fields: { task: "one" } });
    const second = await client.assemble({ fields: { task: "two" } });
    assert.equal(first.sections.at(-1)?.text, "Task: one.");
    assert.equal(second.sections.at(-1)?.text, "Task: two.");
  }));

test("an async provider may read fields directly on the context, as in the original API", () =>
  withClient(async (client) => {
    await client.section({
      name: "cwd",
      order: 10,
      text: async (context) => `cwd: ${String(context["cwd"])}`,
    });
    const assembly = await client.assemble({ fields: { cwd: "/work" } });
    assert.equal(assembly.sections.at(-1)?.text, "cwd: /work");
  }));

test("a complete section becomes the whole prompt", () =>
  withClient(async (client) => {
    await client.section("rules", 10, "Ignored.");
    await client.section("exact", 5, "The exact prompt.", { complete: true });
    const assembly = await client.assemble();
    assert.deepEqual(assembly.sections, [{ name: "exact", text: "The exact prompt." }]);
  }));

test("contexts render into the runtime-context snapshot until suppressed", () =>
  withClient(async (client) => {
    await client.context("mode", 2, "Mode: {{mode}}.");
    await client.context("clock", 1, () => "Time: noon.");
    await client.variable("mode", "review");
    const assembly = await client.assemble();
    assert.deepEqual(assembly.contexts, [
      { name: "clock", text: "Time: noon." },
      { name: "mode", text: "Mode: {{mode}}." },
    ]);
    assert.equal(
      dsp.renderContextSnapshot(assembly),
      `${dsp.CONTEXT_SNAPSHOT_HEADER}\n\nTime: noon.\n\nMode: review.`,
    );
    const off = await client.suppressRuntimeContext();
    assert.deepEqual((await client.assemble()).contexts, []);
    await off();
    assert.equal((await client.assemble()).contexts.length, 2);
  }));

test("variables: static, valueless and dynamic, interpolated by the sidecar and locally alike", () =>
  withClient(async (client) => {
    await client.variable("model", "deepseek-v4");
    await client.variable("none", undefined);
    await client.variable("who", (context) => context.fields["who"] as string | undefined);
    await client.section("persona", 10, "You are {{model}} for {{who}}.");
    const rendered = await client.render({ fields: { who: "alice" } });
    assert.equal(rendered.prompt, `${IDENTITY}\n\nYou are deepseek-v4 for alice.`);
    assert.equal(dsp.renderPrompt(rendered.assembly), rendered.prompt);
    const valueless = await client.assemble();
    assert.deepEqual(valueless.variables, { model: "deepseek-v4", none: undefined, who: undefined });
  }));

test("static and dynamic tools are sorted by name with their schemas byte for byte", () =>
  withClient(async (client) => {
    const parameters = { type: "object", properties: { b: { type: "integer" }, a: { type: "number" } } };
    await client.tools([{ name: "zeta", description: "last", parameters }]);
    await client.tools((context) => ({
      schemas: [new dsp.ToolSchema("alpha", `for ${String(context.fields["who"])}`, { type: "object" })],
      knownNames: ["alpha", "beta"],
    }));
    const assembly = await client.assemble({ fields: { who: "bob" } });
    assert.deepEqual(toolNames(assembly), ["alpha", "zeta"]);
    assert.equal(assembly.tools[0]?.description, "for bob");
    const zeta = assembly.tools[1];
    assert.ok(zeta instanceof dsp.ToolSchema);
    assert.equal(zeta.parametersJson(), JSON.stringify(parameters));
    assert.deepEqual(zeta.parameters, parameters);
  }));

test("a disposer removes its registration, and a second call does nothing", () =>
  withClient(async (client) => {
    const off = await client.section("gone", 10, "Soon gone.");
    await client.section("stays", 20, "Here.");
    await off();
    await off();
    assert.equal(off.disposed, true);
    assert.deepEqual(ownSections(await client.assemble()), ["stays"]);
  }));

test("a report tells where each part came from", () =>
  withClient(async (client) => {
    await client.section("rules", 10, "Be precise.");
    const assembly = await client.assemble({ report: true });
    const part = assembly.report?.parts.find((p) => p.name === "rules");
    assert.equal(part?.kind, "section");
    assert.equal(part?.source.kind, "global");
    assert.equal(part?.bytes, "Be precise.".length);
    assert.equal(assembly.report?.toolOrder, undefined); // the default sorted mode keeps no order
  }));
