/** Ejected callbacks (docs/protocol.md, "Ejected callbacks"): this client installs them again. */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as dsp from "../src/index.js";
import { failure, ownSections, useSidecar } from "./helpers.js";

const harness = useSidecar({ config: ["provider_timeout_s = 0.5"] });

/** Assemble until `done` holds of the result (the re-install waits out its backoff). */
async function assembleUntil(
  client: dsp.Client,
  done: (assembly: dsp.PromptAssembly) => boolean,
): Promise<dsp.PromptAssembly> {
  const deadline = Date.now() + 15_000;
  for (;;) {
    const assembly = await client.assemble();
    if (done(assembly) || Date.now() > deadline) return assembly;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

test("an ejected listener is installed again and its disposer still disposes it", async () => {
  const client = await harness.connect();
  let calls = 0;
  const dispose = await client.onAssemble(async (assembly, _context, next) => {
    calls += 1;
    if (calls === 1) await new Promise((resolve) => setTimeout(resolve, 5_000)); // stuck, once
    assembly.sections.push({ name: "signed", text: "Signed." });
    return next();
  });
  const error = await failure(client.assemble());
  assert.equal(error.reason, "LISTENER_TIMEOUT");
  const assembly = await assembleUntil(client, (a) => ownSections(a).includes("signed"));
  assert.deepEqual(ownSections(assembly), ["signed"]);
  await dispose();
  assert.deepEqual(ownSections(await client.assemble()), []);
});

test("an ejected provider is registered again on the same session", async () => {
  const client = await harness.connect();
  let calls = 0;
  await client.section("clock", 10, async () => {
    calls += 1;
    if (calls === 1) await new Promise((resolve) => setTimeout(resolve, 5_000)); // stuck, once
    return "It is noon.";
  });
  const error = await failure(client.assemble());
  assert.equal(error.reason, "PROVIDER_TIMEOUT");
  const assembly = await assembleUntil(client, (a) => ownSections(a).includes("clock"));
  assert.equal(assembly.sections.at(-1)?.text, "It is noon.");
});
