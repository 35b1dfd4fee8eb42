/** Sessions: closing one, or killing its process, disposes everything it registered. */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { createInterface } from "node:readline";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import type * as dsp from "../src/index.js";
import { ownSections, useSidecar } from "./helpers.js";

const harness = useSidecar();
const AGENT = fileURLToPath(new URL("./fixtures/agent.js", import.meta.url));

async function unregistered(changes: dsp.ChangeStream, names: string[]): Promise<void> {
  const waiting = new Set(names);
  for await (const change of changes) {
    if (change.type === "change" && change.action === "unregistered") waiting.delete(change.name);
    if (waiting.size === 0) return;
  }
}

test("closing a client removes its registrations from other clients' assemblies", async () => {
  const owner = await harness.connect();
  const other = await harness.connect();
  await owner.section("owned", 10, () => "Owned.");
  await owner.variable("v", "x");
  await owner.tools([{ name: "t", description: "", parameters: {} }]);
  await owner.suppressRuntimeContext();
  await other.context("ctx", 1, "Context.");
  assert.deepEqual(ownSections(await other.assemble()), ["owned"]);
  await owner.close();
  const assembly = await other.assemble();
  assert.deepEqual(ownSections(assembly), []);
  assert.deepEqual(assembly.variables, {});
  assert.deepEqual(assembly.tools, []);
  assert.deepEqual(assembly.contexts, [{ name: "ctx", text: "Context." }]);
});

test("a killed Node process's registrations vanish", async () => {
  const observer = await harness.connect();
  const agent = spawn(process.execPath, [AGENT, harness.sidecar.address], { stdio: ["ignore", "pipe", "inherit"] });
  const exited = once(agent, "exit");
  try {
    const [line] = (await once(createInterface({ input: agent.stdout }), "line")) as [string];
    assert.equal(line, "ready");
    assert.deepEqual(ownSections(await observer.assemble()), ["child:rules", "child:dynamic", "child:listener"]);
    const changes = await observer.watchChanges();
    agent.kill("SIGKILL");
    await unregistered(changes, ["child:rules", "child:dynamic", "childListener"]);
    assert.deepEqual(ownSections(await observer.assemble()), []);
  } finally {
    agent.kill("SIGKILL"); // a failed assertion must not leave the agent running
    await exited;
  }
});
