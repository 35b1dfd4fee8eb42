/** `{ failurePolicy: "ignore" }`: a provider or listener an assembly goes on without when it fails (docs/protocol.md, "Failure policy"). */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as dsp from "../src/index.js";
import { failure, ownSections, useSidecar } from "./helpers.js";

const harness = useSidecar();

const broken = (): string => {
  throw new Error("no cwd here");
};

test("an ignored provider that throws is left out and named in assembly.skipped", async () => {
  const client = await harness.connect();
  await client.section("rules", 10, "Be precise.");
  await client.section("cwd", 20, broken, { failurePolicy: dsp.FailurePolicy.IGNORE });
  const assembly = await client.assemble();
  assert.deepEqual(ownSections(assembly), ["rules"]);
  const listed = (await client.snapshot()).registrations.find((r) => r.name === "cwd");
  assert.equal(assembly.skipped?.length, 1);
  const step = assembly.skipped?.[0];
  assert.deepEqual(
    { kind: step?.kind, name: step?.name, scope: step?.scope, ref: step?.ref, reason: step?.reason },
    { kind: "section", name: "cwd", scope: undefined, ref: listed?.ref, reason: dsp.Reason.PROVIDER_FAILED },
  );
  assert.match(step?.message ?? "", /^section provider "cwd" \(global\) failed: .*no cwd here/);
});

test("an ignored listener that throws is passed over and the next one still runs", async () => {
  const client = await harness.connect();
  await client.onAssemble(
    async function weather() {
      throw new Error("no weather today");
    },
    { failurePolicy: "ignore" },
  );
  await client.onAssemble(async function sign(assembly, _context, next) {
    assembly.sections.push({ name: "signature", text: "-- the team" });
    return next(assembly);
  });
  const rendered = await client.render();
  assert.ok(rendered.prompt.endsWith("-- the team"));
  assert.deepEqual(
    rendered.assembly.skipped?.map((s) => [s.kind, s.name, s.reason]),
    [["listener", "weather", dsp.Reason.LISTENER_FAILED]],
  );
});

test("a complete assembly has no skipped steps, and the report lists them when there are", async () => {
  const client = await harness.connect();
  const off = await client.context("cwd", 1, broken, { failurePolicy: "ignore" });
  const reported = await client.assemble({ report: true });
  assert.deepEqual(reported.report?.skipped, reported.skipped);
  await off();
  assert.equal((await client.assemble()).skipped, undefined);
});

test("a provider under fail beside an ignored one still fails the assembly", async () => {
  const client = await harness.connect();
  await client.section("cwd", 20, broken, { failurePolicy: "fail" });
  await client.variable("who", () => "alice", { failurePolicy: "ignore" });
  const error = await failure(client.assemble());
  assert.equal(error.reason, dsp.Reason.PROVIDER_FAILED);
});

test("failurePolicy on a static value, or not a policy, is refused in the client", async () => {
  const client = await harness.connect();
  const refused = [
    await failure(client.section("static", 1, "text", { failurePolicy: "ignore" })),
    await failure(client.variable("static", "value", { failurePolicy: "ignore" })),
    await failure(client.tools([{ name: "static", description: "static", parameters: {} }], { failurePolicy: "ignore" })),
  ];
  for (const error of refused) {
    assert.equal(error.reason, dsp.Reason.INVALID_VALUE);
    assert.equal(error.message, "failurePolicy applies to a provider (a function), not to a static value");
  }
  const bad = await failure(client.section("s", 1, () => "x", { failurePolicy: "sometimes" as dsp.FailurePolicy }));
  assert.equal(bad.message, 'failurePolicy must be "fail" or "ignore", not sometimes');
  const listing = await client.snapshot();
  assert.deepEqual(listing.registrations.filter((r) => r.dynamic).map((r) => r.name), []);
});

test("the cache history counts each reported assembly's skipped steps by kind and reason", async () => {
  const client = await harness.connect();
  const probe = (context: dsp.AssembleContext): string => {
    if (context.fields["down"]) throw new Error("the probe is down");
    return "The probe is up.";
  };
  await client.section("probe-a", 20, probe, { failurePolicy: "ignore" });
  await client.section("probe-b", 21, probe, { failurePolicy: "ignore" });
  await client.context("cwd", 1, broken, { failurePolicy: "ignore" });
  await client.assemble({ scope: "agent-h", report: true, reportKey: "history-skips" });
  await client.assemble({ scope: "agent-h", fields: { down: true }, report: true, reportKey: "history-skips" });
  const history = await client.cacheHistory({ reportKey: "history-skips" });
  assert.deepEqual(
    history.recent.map((entry) => entry.skippedCounts),
    [
      [{ kind: "context", reason: dsp.Reason.PROVIDER_FAILED, count: 1 }],
      [
        { kind: "section", reason: dsp.Reason.PROVIDER_FAILED, count: 2 },
        { kind: "context", reason: dsp.Reason.PROVIDER_FAILED, count: 1 },
      ],
    ],
  );
  assert.equal(history.recent[1]?.firstChanged, 'section "probe-a"');
});

test("an answer over the sidecar's max_message_bytes fails its assembly, naming it, and the session lives on", async () => {
  // A 5 MB answer would be a message over the sidecar's bound (4 MiB): gRPC would end the
  // whole session, disposing everything it registered. The client sends the provider's
  // error instead (issue 34, item 4).
  const client = await harness.connect();
  const sessionId = client.sessionId;
  await client.section("kept", 5, "still here");
  const huge = "x".repeat(5 * 1024 * 1024);
  const dispose = await client.section("dump", 10, () => huge);
  const error = await failure(client.assemble());
  assert.equal(error.reason, dsp.Reason.PROVIDER_FAILED);
  assert.match(error.message, /section provider "dump".*is over the largest message the sidecar reads/);
  await dispose();
  const after = await client.assemble();
  assert.deepEqual(ownSections(after), ["kept"]);
  assert.equal(client.sessionId, sessionId);
});
