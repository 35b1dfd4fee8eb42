/** `{ timeoutS }`: a provider or listener that declares its own time is waited for that long (docs/protocol.md, "Ejected callbacks"). */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as dsp from "../src/index.js";
import { failure, toolNames, useSidecar } from "./helpers.js";

const harness = useSidecar({ config: ["provider_timeout_s = 0.5", "max_callback_timeout_s = 10"] });

const SLOW_MS = 1_500; // three times the sidecar's provider_timeout_s, half the declared time

const slowly = <T>(value: T) =>
  async (): Promise<T> => {
    await new Promise((resolve) => setTimeout(resolve, SLOW_MS));
    return value;
  };

test("providers that declare timeoutS are waited for past provider_timeout_s", async () => {
  const client = await harness.connect();
  await client.section("slow", 1, slowly("late"), { timeoutS: 3 });
  await client.context({ name: "slow-context", order: 1, text: slowly("late"), timeoutS: 3 });
  await client.variable("slow_variable", slowly("late"), { timeoutS: 3 });
  await client.tools(slowly([{ name: "late_tool", description: "late", parameters: { type: "object" } }]), {
    timeoutS: 3,
  });
  const assembly = await client.assemble();
  assert.equal(assembly.sections.find((section) => section.name === "slow")?.text, "late");
  assert.equal(assembly.contexts.find((context) => context.name === "slow-context")?.text, "late");
  assert.equal(assembly.variables["slow_variable"], "late");
  assert.ok(toolNames(assembly).includes("late_tool"));
});

test("a listener that declares timeoutS is waited for past provider_timeout_s", async () => {
  const client = await harness.connect();
  await client.onAssemble(
    async (assembly, _context, next) => {
      await new Promise((resolve) => setTimeout(resolve, SLOW_MS));
      assembly.variables["signed"] = "late";
      return next();
    },
    { timeoutS: 3 },
  );
  assert.equal((await client.assemble()).variables["signed"], "late");
});

test("a timeoutS over max_callback_timeout_s is refused VALUE_TOO_LARGE and leaves nothing", async () => {
  const client = await harness.connect();
  const refused = [
    await failure(client.section("s", 1, () => "x", { timeoutS: 11 })),
    await failure(client.onAssemble(async (assembly, _context, next) => next(assembly), { timeoutS: 11 })),
  ];
  assert.deepEqual(
    refused.map((error) => [error.code, error.reason]),
    [
      [dsp.Code.INVALID_ARGUMENT, dsp.Reason.VALUE_TOO_LARGE],
      [dsp.Code.INVALID_ARGUMENT, dsp.Reason.VALUE_TOO_LARGE],
    ],
  );
  assert.match(refused[0]?.message ?? "", /max_callback_timeout_s/);
  const listing = await client.snapshot();
  assert.deepEqual(
    listing.registrations.filter((r) => r.dynamic || r.kind === "listener").map((r) => r.name),
    [],
  );
});

test("timeoutS on a static value is refused in the client", async () => {
  const client = await harness.connect();
  const refused = [
    await failure(client.section("static", 1, "text", { timeoutS: 3 })),
    await failure(client.section({ name: "static", order: 1, text: "text", timeoutS: 3 })),
    await failure(client.context("static", 1, "text", { timeoutS: 3 })),
    await failure(client.variable("static", "value", { timeoutS: 3 })),
    await failure(client.variable("unset", undefined, { timeoutS: 3 })),
    await failure(client.tools([{ name: "static", description: "static", parameters: {} }], { timeoutS: 3 })),
  ];
  for (const error of refused) {
    assert.equal(error.reason, dsp.Reason.INVALID_VALUE);
    assert.equal(error.message, "timeoutS applies to a provider (a function), not to a static value");
  }
});

test("a timeoutS that is not a positive number is refused in the client", async () => {
  const client = await harness.connect();
  for (const timeoutS of [0, -1, Number.NaN, Number.POSITIVE_INFINITY]) {
    const error = await failure(client.section("s", 1, () => "x", { timeoutS }));
    assert.equal(error.reason, dsp.Reason.INVALID_VALUE);
    assert.match(error.message, /timeoutS must be a positive number of seconds/);
  }
  const listening = await failure(client.onAssemble(async (assembly, _context, next) => next(assembly), { timeoutS: 0 }));
  assert.equal(listening.reason, dsp.Reason.INVALID_VALUE);
});
