/** A sidecar restart: the client reconnects as a new session and replays its registrations. */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as dsp from "../src/index.js";
import { failure, ownSections, waitFor } from "./helpers.js";
import { Sidecar } from "./sidecar.js";

async function withRestarts(run: (sidecar: Sidecar, restart: () => Promise<void>, stop: () => Promise<void>) => Promise<void>): Promise<void> {
  let sidecar = await Sidecar.start();
  const address = sidecar.address;
  try {
    await run(
      sidecar,
      async () => {
        await sidecar.stop();
        sidecar = await Sidecar.restartAt(address);
      },
      () => sidecar.stop(),
    );
  } finally {
    await sidecar.stop();
  }
}

test("a client reconnects after a restart and its assemblies are as before", () =>
  withRestarts(async (sidecar, restart) => {
    const client = await dsp.connect(sidecar.address);
    try {
      await client.section("static", 10, "Static {{model}}.");
      await client.section("dynamic", 20, (context) => `Dynamic for ${String(context.fields["who"])}.`);
      await client.variable("model", () => "m");
      await client.tools([{ name: "tool", description: "d", parameters: { type: "object" } }]);
      const scope = await client.scope("agent", "team");
      await scope.section("scoped", 30, "Scoped.");
      await client.onAssemble(async (assembly, _context, next) => {
        assembly.sections.push({ name: "listener", text: "Listened." });
        return next();
      });
      const before = await client.render({ scope: "agent", fields: { who: "x" } });
      const session = client.sessionId;

      await restart();
      await waitFor(() => client.connected && client.sessionId !== session, "the reconnect");

      const after = await client.render({ scope: "agent", fields: { who: "x" } });
      assert.equal(after.prompt, before.prompt);
      assert.deepEqual(ownSections(after.assembly), ["static", "dynamic", "scoped", "listener"]);
      assert.deepEqual(after.assembly.tools.map((t) => t.name), ["tool"]);
    } finally {
      await client.close();
    }
  }));

test("disposers from before a restart still work after it", () =>
  withRestarts(async (sidecar, restart) => {
    const client = await dsp.connect(sidecar.address);
    try {
      const off = await client.section("gone", 10, "Gone.");
      const scope = await client.scope("temporary");
      await scope.section("scoped", 10, "Scoped.");
      const session = client.sessionId;
      await restart();
      await waitFor(() => client.connected && client.sessionId !== session, "the reconnect");
      await off();
      await scope.dispose();
      assert.deepEqual(ownSections(await client.assemble({ scope: "temporary" })), []);
    } finally {
      await client.close();
    }
  }));

test("calls while the sidecar is down fail fast as UNAVAILABLE, or wait with a timeout", () =>
  withRestarts(async (sidecar, restart, stop) => {
    const client = await dsp.connect(sidecar.address);
    try {
      await client.section("kept", 10, "Kept.");
      await stop();
      await waitFor(() => !client.connected, "the disconnect");
      const started = Date.now();
      const error = await failure(client.assemble());
      assert.equal(error.code, dsp.Code.UNAVAILABLE);
      assert.equal(error.reason, dsp.Reason.SIDECAR_UNAVAILABLE);
      assert.ok(Date.now() - started < 1_000);
      const waiting = client.assemble({ timeoutMs: 20_000 });
      await restart();
      assert.deepEqual(ownSections(await waiting), ["kept"]);
    } finally {
      await client.close();
    }
  }));

test("waitForReady connects to a sidecar that starts later", async () => {
  const probe = await Sidecar.start();
  const address = probe.address;
  await probe.stop();
  const connecting = dsp.connect(address, { waitForReady: 20_000 });
  const sidecar = await Sidecar.restartAt(address);
  try {
    const client = await connecting;
    await client.section("late", 1, "Late.");
    assert.deepEqual(ownSections(await client.assemble()), ["late"]);
    await client.close();
  } finally {
    await sidecar.stop();
  }
});
