/**
 * Blame only who was late (issue 34, item 4): with `each-answer` (docs/protocol.md,
 * "Versions and features") this client answers a ProvideRequest provider by provider, so
 * the sidecar takes the answers that came and judges each provider against its own time.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as dsp from "../src/index.js";
import { ownSections, toolNames, useSidecar, waitFor } from "./helpers.js";

// The sidecar's 0.5 s for a provider that declares none; ejected after one timeout (the default).
const harness = useSidecar({ config: ["provider_timeout_s = 0.5", "max_callback_timeout_s = 10"] });

const IGNORE = { failurePolicy: dsp.FailurePolicy.IGNORE };

/**
 * The names of the providers `changes` saw ejected before `marker` registered: the sidecar
 * ejects while it judges an exchange, before the assembly answers, so a marker registered
 * after the assembly closes the count.
 */
async function ejectedBefore(changes: dsp.ChangeStream, marker: string): Promise<string[]> {
  const ejected: string[] = [];
  for await (const change of changes) {
    if (change.type !== "change") continue;
    if (change.action === "registered" && change.name === marker) break;
    if (change.action === "unregistered" && change.reason?.startsWith("ejected: ")) ejected.push(change.name);
  }
  return ejected;
}

test("a slow provider is ejected alone and its session's instant providers are taken", async () => {
  const client = await harness.connect();
  const scope = await client.scope("ts-blame");
  const changes = await client.watchChanges({ scope: "ts-blame" });
  // All three under IGNORE, so one ProvideRequest asks for them all. The instant two may
  // take 5 s each (a loaded machine never makes them late); the slow one has the
  // sidecar's 0.5 s and answers only once the sidecar gives up on it.
  await scope.section(
    "slow",
    10,
    (context) => new Promise<string>((resolve) => context.signal.addEventListener("abort", () => resolve("too late"))),
    IGNORE,
  );
  await scope.section("instant", 20, async () => "Here at once.", { ...IGNORE, timeoutS: 5 });
  await scope.tools(async () => [{ name: "search", description: "Search.", parameters: {} }], {
    ...IGNORE,
    timeoutS: 5,
    name: "instant-tools",
  });

  const assembly = await client.assemble({ scope: "ts-blame" });
  await scope.section("marker", 1, "After the assembly.");

  // Without the feature the exchange timed out as a whole: all three were ejected and
  // skipped, and the instant ones' parts were missing.
  assert.deepEqual(await ejectedBefore(changes, "marker"), ["slow"]);
  assert.deepEqual(
    (assembly.skipped ?? []).map((step) => [step.name, step.reason]),
    [["slow", dsp.Reason.PROVIDER_TIMEOUT]],
  );
  assert.deepEqual(ownSections(assembly), ["instant"]);
  assert.equal(assembly.sections.at(-1)?.text, "Here at once.");
  assert.deepEqual(toolNames(assembly), ["search"]);
});

test("an answer over max_message_bytes fails only its own provider, and its neighbour's is taken", async () => {
  const client = await harness.connect();
  const scope = await client.scope("ts-blame-oversize");
  // Both under IGNORE, in one ProvideRequest: the 5 MB answer (over the default 4 MiB) is
  // sent as its provider's error, and the sidecar logs it.
  const huge = "x".repeat(5 * 1024 * 1024);
  await scope.section("dump", 10, () => huge, IGNORE);
  await scope.section("small", 20, () => "Small.", IGNORE);
  const logged = "over the largest message read";
  const count = () => harness.sidecar.log.split(logged).length - 1;
  const before = count();
  const assembly = await client.assemble({ scope: "ts-blame-oversize" });
  assert.deepEqual(
    (assembly.skipped ?? []).map((step) => [step.name, step.reason]),
    [["dump", dsp.Reason.PROVIDER_FAILED]],
  );
  assert.match(assembly.skipped?.[0]?.message ?? "", /is over the largest message the sidecar reads/);
  assert.deepEqual(ownSections(assembly), ["small"]);
  // Its stderr comes on a pipe of its own, maybe after the answer: awaited, then counted.
  await waitFor(() => count() > before, "the sidecar's log of the refused answer");
  assert.equal(count(), before + 1);
});
