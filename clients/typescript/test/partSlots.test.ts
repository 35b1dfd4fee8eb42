/**
 * Part slots (docs/protocol.md, "Part slots") on a real sidecar: whatever a listener does
 * to its assembly, before or after next(), comes out as if every part were sent in full,
 * on the stream's first invocation and on the ones named against its base.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as dsp from "../src/index.js";
import { useSidecar } from "./helpers.js";

const harness = useSidecar();

type Change = (assembly: dsp.PromptAssembly) => void;

const CHANGES: Record<string, Change> = {
  reorders: (a) => {
    a.sections.reverse();
    a.contexts.reverse();
    a.tools.reverse();
    a.variables = Object.fromEntries(Object.entries(a.variables).reverse());
  },
  removes: (a) => {
    a.sections.splice(1, 1);
    a.contexts.splice(0, 1);
    a.tools.pop();
    delete a.variables["mode"];
  },
  replaces: (a) => {
    a.sections.at(-1)!.text = "changed in place";
    a.contexts[a.contexts.length - 1] = { name: a.contexts.at(-1)!.name, text: "a new text" };
    a.tools[0] = { name: a.tools[0]!.name, description: "a new description", parameters: {} };
    (a.tools[1] as dsp.ToolSchema).parameters["title"] = "changed in place";
    a.variables["mode"] = "replaced";
    a.variables["user"] = undefined;
  },
  adds: (a) => {
    a.sections.unshift({ name: "added", text: "a new section" });
    a.contexts.push({ name: "added", text: "a new context" });
    a.tools.push({ name: "added", description: "a new tool", parameters: {} });
    a.variables["added"] = "a new variable";
  },
};

async function load(client: dsp.Client): Promise<void> {
  for (const [order, name] of ["rules", "style", "notes"].entries()) await client.section(name, 10 + order, `the ${name} section`);
  await client.context("cwd", 1, "/work");
  await client.context("branch", 2, "main");
  await client.tools(["bash", "read", "grep"].map((name) => ({ name, description: `the ${name} tool`, parameters: { type: "object" } })));
  for (const [name, value] of [["mode", "fast"], ["user", "ann"], ["host", "box"]] as const) await client.variable(name, value);
}

/** An assembly as plain values, so that two compare whatever objects hold them. */
function plain(assembly: dsp.PromptAssembly): unknown {
  return {
    sections: assembly.sections.map(({ name, text }) => [name, text]),
    contexts: assembly.contexts.map(({ name, text }) => [name, text]),
    tools: assembly.tools.map((tool) => [tool.name, tool.description ?? "", JSON.stringify(tool.parameters ?? {})]),
    variables: Object.entries(assembly.variables).map(([name, value]) => [name, value ?? null]),
  };
}

function changed(assembly: dsp.PromptAssembly, ...changes: Change[]): unknown {
  const copy: dsp.PromptAssembly = {
    sections: assembly.sections.map((s) => ({ ...s })),
    contexts: assembly.contexts.map((c) => ({ ...c })),
    tools: assembly.tools.map((t) => new dsp.ToolSchema(t.name, t.description ?? "", structuredClone(t.parameters ?? {}))),
    variables: { ...assembly.variables },
  };
  for (const change of changes) change(copy);
  return plain(copy);
}

for (const [label, change] of Object.entries(CHANGES)) {
  for (const around of ["before", "after"] as const) {
    test(`a listener that ${label} parts ${around} next() comes out as if every part were sent`, async () => {
      const client = await harness.connect();
      await load(client);
      const base = await client.assemble();
      await client.onAssemble(async (assembly, _context, next) => {
        if (around === "before") {
          change(assembly);
          return next();
        }
        const result = await next();
        change(result);
        return result;
      });
      const first = await client.assemble();
      await client.section("late", 11.5, "registered between two assemblies");
      const grown = await client.assemble();
      const again = await client.assemble(); // named against the assembly before
      assert.deepEqual(plain(first), changed(base, change));
      const late = { name: "late", text: "registered between two assemblies" };
      base.sections.splice(base.sections.findIndex((s) => s.name === "notes"), 0, late);
      assert.deepEqual(plain(grown), changed(base, change));
      assert.deepEqual(plain(again), changed(base, change));
    });
  }
}

test("chained listeners each change what the one before handed on", async () => {
  const client = await harness.connect();
  await load(client);
  const base = await client.assemble();
  const before = (change: Change): dsp.Listener => async (assembly, _context, next) => {
    change(assembly);
    return next();
  };
  await client.onAssemble(before(CHANGES["adds"]!));
  await client.onAssemble(before(CHANGES["replaces"]!));
  await client.onAssemble(async (_assembly, _context, next) => {
    const result = await next();
    CHANGES["reorders"]!(result);
    return result;
  });
  await client.onAssemble(before(CHANGES["removes"]!));
  const expected = changed(base, CHANGES["adds"]!, CHANGES["replaces"]!, CHANGES["removes"]!, CHANGES["reorders"]!);
  assert.deepEqual(plain(await client.assemble()), expected);
  assert.deepEqual(plain(await client.assemble()), expected);
});

test("a listener may repeat an unchanged part more often than parts are held", async () => {
  const client = await harness.connect();
  await load(client);
  const base = await client.assemble();
  const repeatTools: Change = (a) => {
    a.tools = Array.from({ length: 5 }, () => a.tools[0]!); // five copies of one of the three tools held
  };
  await client.onAssemble(async (assembly, _context, next) => {
    const unique = assembly.sections;
    assembly.sections = [...Array.from({ length: 4 }, () => unique[0]!), ...unique]; // handed on with names repeated
    const result = await next(assembly);
    result.sections = unique;
    return result;
  });
  await client.onAssemble(async (_assembly, _context, next) => {
    const result = await next();
    repeatTools(result);
    return result;
  });
  const expected = changed(base, repeatTools);
  assert.deepEqual(plain(await client.assemble()), expected);
  assert.deepEqual(plain(await client.assemble()), expected); // each stream's second invocation against its base
});
