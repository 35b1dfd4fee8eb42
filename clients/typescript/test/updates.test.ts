/** Updates in place through a registration's handle: one `updated` event, never a gap, replayed as updated. */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as dsp from "../src/index.js";
import { failure, ownSections, toolNames, useSidecar, waitFor } from "./helpers.js";
import { Sidecar } from "./sidecar.js";

const harness = useSidecar();

async function nextChange(changes: dsp.ChangeStream): Promise<dsp.ChangeEvent> {
  const item = await changes.next();
  assert.ok(!item.done && item.value.type === "change", "a change event");
  return item.value;
}

test("an update is one updated event with a new revision, its ref and the new fingerprint", async () => {
  const client = await harness.connect();
  const rules = await client.section("rules", 10, "Be precise.");
  const changes = await client.watchChanges();
  const revision = await rules.update("Be exact.");
  const event = await nextChange(changes);
  assert.deepEqual([event.revision, event.action, event.kind, event.name], [revision, "updated", "section", "rules"]);
  const listed = (await client.snapshot({ kinds: ["section"] })).registrations.find((info) => info.name === "rules");
  assert.equal(event.ref, listed?.ref);
  assert.equal(event.fingerprint, listed?.fingerprint);
  assert.equal((await client.assemble()).sections.at(-1)?.text, "Be exact.");
  changes.close();
});

test("an update keeps the name, order and place of the section", async () => {
  const client = await harness.connect();
  await client.section("first", 1, "1");
  const middle = await client.section("middle", 2, "2");
  await client.section("last", 3, "3");
  await middle.update("two");
  const assembly = await client.assemble();
  assert.deepEqual(ownSections(assembly), ["first", "middle", "last"]);
  assert.deepEqual(
    assembly.sections.slice(-3).map((s) => s.text),
    ["1", "two", "3"],
  );
});

test("a variable updates to no value and back; contexts and tools update too", async () => {
  const client = await harness.connect();
  const model = await client.variable("model", "m1");
  const cwd = await client.context("cwd", 1, "/a");
  const tools = await client.tools([{ name: "old", description: "d", parameters: {} }]);
  await model.update(undefined);
  assert.equal((await client.assemble()).variables["model"], undefined);
  assert.ok("model" in (await client.assemble()).variables);
  await model.update("m2");
  await cwd.update("/b");
  await tools.update({ schemas: [{ name: "new", description: "d", parameters: {} }] });
  const assembly = await client.assemble();
  assert.equal(assembly.variables["model"], "m2");
  assert.equal(assembly.contexts.at(-1)?.text, "/b");
  assert.deepEqual(toolNames(assembly), ["new"]);
});

test("a dynamic registration is not updatable, and update() takes only a static value", async () => {
  const client = await harness.connect();
  const dynamic = await client.section("dynamic", 1, () => "asked");
  const refused = await failure(dynamic.update("static now"));
  assert.equal(refused.code, dsp.Code.FAILED_PRECONDITION);
  assert.equal(refused.reason, dsp.Reason.NOT_UPDATABLE);
  const still = await client.section("static", 2, "text");
  const provider = await failure(still.update(() => "a provider"));
  assert.equal(provider.reason, dsp.Reason.INVALID_VALUE);
  const wrongType = await failure(still.update(42));
  assert.equal(wrongType.reason, dsp.Reason.INVALID_VALUE);
  assert.deepEqual(
    (await client.assemble()).sections.slice(-2).map((s) => s.text),
    ["asked", "text"],
  );
});

test("the handle is still a disposer; an update after dispose is NOT_FOUND", async () => {
  const client = await harness.connect();
  const gone = await client.section("gone", 1, "x");
  await gone();
  assert.ok(gone.disposed);
  const error = await failure(gone.update("y"));
  assert.equal(error.code, dsp.Code.NOT_FOUND);
  assert.deepEqual(ownSections(await client.assemble()), []);
});

test("renders racing 100 updates of a variable never fail", async () => {
  const owner = await harness.connect();
  const reader = await harness.connect();
  await owner.section("uses", 1, "Model: {{model}}.");
  const model = await owner.variable("model", "m0");
  let done = false;
  let renders = 0;
  const rendering = (async () => {
    while (!done) {
      const rendered = await reader.render();
      assert.match(rendered.prompt, /Model: m\d+\./);
      renders += 1;
    }
  })();
  for (let index = 1; index <= 100; index += 1) await model.update(`m${index}`);
  done = true;
  await rendering;
  assert.ok(renders > 0);
});

test("a replay after a restart registers the latest value, and the handle works on the new session", async () => {
  const first = await Sidecar.start();
  const address = first.address;
  let second: Sidecar | undefined;
  const client = await dsp.connect(address);
  try {
    const model = await client.variable("model", "before");
    await model.update("after");
    await first.stop();
    await waitFor(() => !client.connected, "the client sees the sidecar gone");
    second = await Sidecar.restartAt(address);
    await waitFor(() => client.connected, "the reconnect");
    assert.equal((await client.assemble({ timeoutMs: 5_000 })).variables["model"], "after");
    await model.update("later");
    assert.equal((await client.assemble({ timeoutMs: 5_000 })).variables["model"], "later");
  } finally {
    await client.close();
    await first.stop();
    await second?.stop();
  }
});
