/** Errors: status codes, reasons and the sidecar's own messages; nothing left behind. */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as grpc from "@grpc/grpc-js";
import { errorFromGrpc } from "../src/errors.js";
import * as dsp from "../src/index.js";
import { failure, ownSections, useSidecar } from "./helpers.js";

const harness = useSidecar({ config: ["provider_timeout_s = 1"] });

test("a duplicate section name is ALREADY_EXISTS with reason DUPLICATE_NAME", async () => {
  const client = await harness.connect();
  await client.section("rules", 10, "One.");
  const error = await failure(client.section("rules", 20, "Two."));
  assert.ok(error instanceof dsp.SystemPromptError);
  assert.equal(error.code, dsp.Code.ALREADY_EXISTS);
  assert.equal(error.reason, dsp.Reason.DUPLICATE_NAME);
  assert.equal(
    error.message,
    'prompt section "rules" is already registered (for a per-agent override, register through that agent\'s scope instead)',
  );
});

test("a non-finite order is INVALID_ARGUMENT with reason INVALID_ORDER", async () => {
  const client = await harness.connect();
  const error = await failure(client.section("bad-order", Number.NaN, "x"));
  assert.equal(error.code, dsp.Code.INVALID_ARGUMENT);
  assert.equal(error.reason, dsp.Reason.INVALID_ORDER);
  assert.equal(error.message, 'prompt section "bad-order" order must be a finite number');
});

test("an order or a text of the wrong type fails before anything is sent", async () => {
  const client = await harness.connect();
  const order = await failure(client.section("x", "10" as unknown as number, "x"));
  assert.equal(order.code, dsp.Code.INVALID_ARGUMENT);
  assert.match(order.message, /order must be a number, not string/);
  const text = await failure(client.section("x", 10, 42 as unknown as string));
  assert.match(text.message, /text must be a string or a function, not number/);
  assert.deepEqual(ownSections(await client.assemble()), []);
});

test("an invalid variable name is INVALID_ARGUMENT with reason INVALID_VARIABLE_NAME", async () => {
  const client = await harness.connect();
  const error = await failure(client.variable("Not Valid", "x"));
  assert.equal(error.reason, dsp.Reason.INVALID_VARIABLE_NAME);
  assert.equal(error.message, 'invalid prompt variable name "Not Valid" (must match /^[a-z][a-z0-9_]*$/)');
});

test("a rejected dynamic registration leaves nothing behind: the name is free again", async () => {
  const client = await harness.connect();
  await client.section("taken", 1, "Taken.");
  await failure(client.section("taken", 2, () => "never asked"));
  const off = await client.section("free", 3, () => "asked");
  assert.equal((await client.assemble()).sections.at(-1)?.text, "asked");
  await off();
});

test("a provider that raises fails the assembly as ABORTED with its message", async () => {
  const client = await harness.connect();
  await client.section("broken", 10, () => {
    throw new TypeError("provider broke");
  });
  const error = await failure(client.assemble());
  assert.equal(error.code, dsp.Code.ABORTED);
  assert.equal(error.reason, dsp.Reason.PROVIDER_FAILED);
  assert.match(error.message, /TypeError: provider broke/);
});

test("a provider that returns the wrong type fails the assembly", async () => {
  const client = await harness.connect();
  await client.section("wrong", 10, (() => 42) as unknown as () => string);
  const error = await failure(client.assemble());
  assert.equal(error.reason, dsp.Reason.PROVIDER_FAILED);
  assert.match(error.message, /a text provider must return a string/);
});

test("a provider that never answers times out naming its registration, and is told to stop", async () => {
  const client = await harness.connect();
  let aborted = false;
  await client.section("hangs", 10, (context) => {
    context.signal.addEventListener("abort", () => {
      aborted = true;
    });
    return new Promise<string>(() => undefined);
  });
  const error = await failure(client.assemble());
  assert.equal(error.code, dsp.Code.DEADLINE_EXCEEDED);
  assert.equal(error.reason, dsp.Reason.PROVIDER_TIMEOUT);
  assert.match(error.message, /hangs/);
  assert.equal(aborted, true);
});

test("rendering fails the same way on the sidecar and locally", async () => {
  const client = await harness.connect();
  await client.variable("model", "m");
  await client.section("persona", 10, "Hi {{modle}}.");
  const remote = await failure(client.render());
  assert.ok(remote instanceof dsp.RenderError);
  assert.equal(remote.code, dsp.Code.FAILED_PRECONDITION);
  assert.equal(remote.reason, dsp.Reason.RENDER_FAILED);
  const assembly = await client.assemble();
  assert.throws(() => dsp.renderPrompt(assembly), { name: "RenderError", message: remote.message });
  assert.equal(
    remote.message,
    'unknown prompt variable "{{modle}}" in section "persona"; registered variables: model',
  );
});

test("more than one complete section rejects the assembly with its reason", async () => {
  const client = await harness.connect();
  await client.section("first", 1, "A.", { complete: true });
  await client.section("second", 2, "B.", { complete: true });
  const error = await failure(client.assemble());
  assert.equal(error.code, dsp.Code.FAILED_PRECONDITION);
  assert.equal(error.reason, dsp.Reason.MULTIPLE_COMPLETE_SECTIONS);
  assert.equal(error.message, 'multiple complete prompt sections are active: "first", "second"');
});

test("a closed client fails every call with FAILED_PRECONDITION", async () => {
  const client = await harness.connect();
  await client.close();
  await client.close();
  const error = await failure(client.section("late", 1, "Late."));
  assert.equal(error.code, dsp.Code.FAILED_PRECONDITION);
  assert.equal(error.reason, dsp.Reason.SESSION_CLOSED);
});

test("an unreachable sidecar is UNAVAILABLE at connect", async () => {
  const error = await failure(dsp.connect("127.0.0.1:1"));
  assert.equal(error.code, dsp.Code.UNAVAILABLE);
  assert.equal(error.reason, dsp.Reason.SIDECAR_UNAVAILABLE);
  assert.match(error.message, /^sidecar unavailable/);
});

test("the reason is read from ErrorInfo, else from the plain trailer, else UNKNOWN", () => {
  const trailers = new grpc.Metadata();
  trailers.set("dsh-error-reason", "QUOTA_EXCEEDED");
  const plain = errorFromGrpc({ code: dsp.Code.RESOURCE_EXHAUSTED, details: "too many", metadata: trailers });
  assert.equal(plain.reason, dsp.Reason.QUOTA_EXCEEDED);
  const none = errorFromGrpc({ code: dsp.Code.INTERNAL, details: "odd", metadata: new grpc.Metadata() });
  assert.equal(none.reason, dsp.Reason.UNKNOWN);
  assert.equal(dsp.Reason.BAD_TOOL_SLOT, "BAD_TOOL_SLOT");
  assert.ok(!("ERROR_REASON_UNSPECIFIED" in dsp.Reason));
});
