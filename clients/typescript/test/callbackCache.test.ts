/**
 * Cacheable callbacks on a real sidecar (the TypeScript twin of clients/go/dsp/callback_cache_test.go):
 * a provider or listener made with `cache` is asked once, and asked again after every change
 * that could change its answer, after its own `invalidate()`, and once its time to live is over.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as dsp from "../src/index.js";
import { failure, useSidecar } from "./helpers.js";

const harness = useSidecar();

/** A text provider that answers how many times it was asked. */
function counted(): { asked: number; text: () => string } {
  const provider = { asked: 0, text: (): string => `asked ${++provider.asked}` };
  return provider;
}

/** The text of the part `name` in the next assembly (with `options`); "<absent>" without one. */
async function textOf(client: dsp.Client, name: string, options: dsp.AssembleOptions = {}): Promise<string> {
  const assembly = await client.assemble(options);
  return [...assembly.sections, ...assembly.contexts].find((part) => part.name === name)?.text ?? "<absent>";
}

/** A listener that appends a section saying how often it was invoked. */
function appending(name: string): { invoked: number; listener: dsp.Listener } {
  const counter = {
    invoked: 0,
    listener: (assembly: dsp.PromptAssembly, _context: dsp.AssembleContext, next: dsp.NextFn) => {
      assembly.sections.push({ name, text: `invoked ${++counter.invoked}` });
      return next();
    },
  };
  return counter;
}

test("a provider without cache is asked at every assembly", async () => {
  const client = await harness.connect();
  await client.section("dynamic", 1, counted().text);
  await client.assemble();
  assert.equal(await textOf(client, "dynamic"), "asked 2");
});

test("a revision-cached provider is asked once per revision, whatever the context", async () => {
  const client = await harness.connect();
  const provider = counted();
  await client.section("dynamic", 1, provider.text, { cache: dsp.Cache.REVISION });
  assert.equal(await textOf(client, "dynamic", { fields: { who: "a" } }), "asked 1");
  assert.equal(await textOf(client, "dynamic", { scope: "other", fields: { who: "b" } }), "asked 1");
  assert.equal(provider.asked, 1);
});

test("a registration, an update and a disposal drop cached answers", async () => {
  const client = await harness.connect();
  await client.section("dynamic", 1, counted().text, { cache: dsp.Cache.REVISION });
  await client.assemble();
  assert.equal(await textOf(client, "dynamic"), "asked 1");
  const other = await client.section("other", 2, "one");
  assert.equal(await textOf(client, "dynamic"), "asked 2");
  await other.update("two");
  assert.equal(await textOf(client, "dynamic"), "asked 3");
  await other();
  assert.equal(await textOf(client, "dynamic"), "asked 4");
});

test("a fields-cached provider is asked once per context", async () => {
  const client = await harness.connect();
  const seen: unknown[] = [];
  const provide = (context: dsp.AssembleContext): string => {
    seen.push(context.fields["who"]);
    return `for ${String(context.fields["who"])}`;
  };
  await client.context("dynamic", 1, provide, { cache: dsp.Cache.FIELDS });
  for (const who of ["a", "b", "a", "b"]) assert.equal(await textOf(client, "dynamic", { fields: { who } }), `for ${who}`);
  assert.deepEqual(seen, ["a", "b"]);
});

test("a provider invalidating its answers is asked again, and the others are kept", async () => {
  const client = await harness.connect();
  await client.section("kept", 1, counted().text, { cache: dsp.Cache.REVISION });
  const dropped = await client.section("dropped", 2, counted().text, { cache: dsp.Cache.REVISION });
  await client.assemble();
  await client.assemble();
  await dropped.invalidate();
  assert.deepEqual([await textOf(client, "kept"), await textOf(client, "dropped")], ["asked 1", "asked 2"]);
});

test("a cached variable and tools provider are asked once", async () => {
  const client = await harness.connect();
  let variables = 0;
  let tools = 0;
  await client.variable("who", () => (variables++, "me"), { cache: dsp.Cache.REVISION });
  await client.tools(() => (tools++, [{ name: "search", description: "Search.", parameters: {} }]), {
    cache: dsp.Cache.ttl(3600),
  });
  for (let i = 0; i < 3; i++) await client.assemble();
  assert.deepEqual([variables, tools], [1, 1]);
});

test("a time-to-live cached answer is asked for again once it expires", async () => {
  const client = await harness.connect();
  await client.section("dynamic", 1, counted().text, { cache: dsp.Cache.ttl(0.05) });
  await client.assemble();
  await new Promise((resolve) => setTimeout(resolve, 100)); // past its time to live, however slow the machine
  assert.equal(await textOf(client, "dynamic"), "asked 2");
});

test("a cached listener is invoked once for the same input, and again after invalidate()", async () => {
  const client = await harness.connect();
  const counter = appending("listened");
  const listener = await client.onAssemble(counter.listener, { cache: dsp.Cache.REVISION });
  assert.equal(await textOf(client, "listened"), "invoked 1");
  assert.equal(await textOf(client, "listened"), "invoked 1");
  await listener.invalidate();
  assert.equal(await textOf(client, "listened"), "invoked 2");
});

test("a fields-cached listener is invoked again for another context", async () => {
  const client = await harness.connect();
  await client.onAssemble(appending("listened").listener, { cache: dsp.Cache.FIELDS });
  assert.equal(await textOf(client, "listened"), "invoked 1");
  assert.equal(await textOf(client, "listened", { fields: { turn: 2 } }), "invoked 2");
  assert.equal(await textOf(client, "listened"), "invoked 1");
});

test("invalidate() of a static, uncached or disposed registration does nothing", async () => {
  const client = await harness.connect();
  await (await client.section("static", 1, "text")).invalidate();
  await (await client.section("pulled", 1, counted().text)).invalidate();
  const dynamic = await client.section("dynamic", 2, counted().text, { cache: dsp.Cache.REVISION });
  await dynamic();
  await dynamic.invalidate();
  const listener = await client.onAssemble(appending("listened").listener);
  await listener();
  await listener.invalidate();
  assert.equal(await textOf(client, "dynamic"), "<absent>");
});

test("cache on a static value, a time to live that is not positive and a malformed policy are refused", async () => {
  const client = await harness.connect();
  const onStatic = await failure(client.section("static", 1, "text", { cache: dsp.Cache.REVISION }));
  assert.deepEqual(
    [onStatic.code, onStatic.reason, onStatic.message],
    [dsp.Code.INVALID_ARGUMENT, dsp.Reason.INVALID_VALUE, "cache applies to a provider (a function), not to a static value"],
  );
  assert.throws(() => dsp.Cache.ttl(0), { message: "a time to live must be a positive number of seconds, not 0" });
  const malformed = await failure(
    client.onAssemble(appending("x").listener, { cache: { fields: "yes" } as unknown as dsp.Cache }),
  );
  assert.deepEqual(
    [malformed.reason, malformed.message],
    [dsp.Reason.INVALID_VALUE, 'cache must be Cache.REVISION, Cache.FIELDS or Cache.ttl(seconds), not {"fields":"yes"}'],
  );
  const negative = await failure(client.variable("who", () => "me", { cache: { fields: false, ttlS: -1 } }));
  assert.equal(negative.reason, dsp.Reason.INVALID_VALUE);
});
