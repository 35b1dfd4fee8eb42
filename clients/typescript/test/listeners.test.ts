/** Waterfall listeners: order, prepend, short-circuit, post-processing, tail calls, tools. */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as grpc from "@grpc/grpc-js";
import * as dsp from "../src/index.js";
import { failure, ownSections, sectionNames, toolNames, useSidecar, waitFor } from "./helpers.js";

const harness = useSidecar();

function appending(name: string, log?: string[]): dsp.Listener {
  return async (assembly, _context, next) => {
    log?.push(name);
    assembly.sections.push({ name, text: `added by ${name}` });
    return next();
  };
}

/** An interceptor that counts what each Listen stream receives after its registration. */
function listenCounter(): { interceptor: grpc.Interceptor; counts: number[] } {
  const counts: number[] = [];
  const interceptor: grpc.Interceptor = (options, nextCall) => {
    if (!options.method_definition.path.endsWith("/Listen")) return new grpc.InterceptingCall(nextCall(options));
    const index = counts.push(-1) - 1; // the ListenerRegistered is not counted
    const requester = new grpc.RequesterBuilder()
      .withStart((metadata, listener, next) => {
        const counting = new grpc.ListenerBuilder()
          .withOnReceiveMessage((message, nextMessage) => {
            counts[index] = (counts[index] ?? 0) + 1;
            nextMessage(message);
          })
          .build();
        next(metadata, { ...listener, ...counting });
      })
      .build();
    return new grpc.InterceptingCall(nextCall(options), requester);
  };
  return { interceptor, counts };
}

/** An interceptor counting the Dispose calls made, and the status code of each refused. */
function disposeCounter(): { interceptor: grpc.Interceptor; calls: () => number; refused: grpc.status[] } {
  let calls = 0;
  const refused: grpc.status[] = [];
  const interceptor: grpc.Interceptor = (options, nextCall) => {
    if (!options.method_definition.path.endsWith("/Dispose")) return new grpc.InterceptingCall(nextCall(options));
    calls += 1;
    const requester = new grpc.RequesterBuilder()
      .withStart((metadata, listener, next) => {
        const watching = new grpc.ListenerBuilder()
          .withOnReceiveStatus((status, nextStatus) => {
            if (status.code !== grpc.status.OK) refused.push(status.code);
            nextStatus(status);
          })
          .build();
        next(metadata, { ...listener, ...watching });
      })
      .build();
    return new grpc.InterceptingCall(nextCall(options), requester);
  };
  return { interceptor, calls: () => calls, refused };
}

test("listeners run in registration order, prepended ones first", async () => {
  const client = await harness.connect();
  const log: string[] = [];
  await client.onAssemble(appending("a", log));
  await client.onAssemble(appending("b", log));
  await client.onAssemble(appending("first", log), { prepend: true });
  const assembly = await client.assemble();
  assert.deepEqual(log, ["first", "a", "b"]);
  assert.deepEqual(ownSections(assembly), ["first", "a", "b"]);
});

test("a listener short-circuits by returning without calling next()", async () => {
  const client = await harness.connect();
  const log: string[] = [];
  await client.onAssemble(async () => ({
    sections: [{ name: "only", text: "Short." }],
    contexts: [],
    tools: [],
    variables: {},
  }));
  await client.onAssemble(appending("never", log));
  const assembly = await client.assemble();
  assert.deepEqual(sectionNames(assembly), ["only"]);
  assert.deepEqual(log, []);
});

test("a listener post-processes what next() returned", async () => {
  const client = await harness.connect();
  await client.onAssemble(async (assembly, _context, next) => {
    const returned = await next(assembly);
    returned.sections = returned.sections.map((s) => ({ ...s, text: s.text.toUpperCase() }));
    return returned;
  });
  await client.onAssemble(appending("later"));
  const assembly = await client.assemble();
  assert.equal(assembly.sections.at(-1)?.text, "ADDED BY LATER");
});

test("a listener sees the caller's context and adds a variable used in rendering", async () => {
  const client = await harness.connect();
  await client.section("greeting", 10, "Hello {{name}}.");
  await client.onAssemble((assembly, context, next) => {
    assembly.variables["name"] = String(context.fields["who"]);
    return next();
  });
  const rendered = await client.render({ fields: { who: "carol" } });
  assert.ok(rendered.prompt.endsWith("Hello carol."));
});

test("return next() is a tail call: one message per assembly instead of two", async () => {
  const { interceptor, counts } = listenCounter();
  const client = await harness.connect({ interceptors: [interceptor] });
  await client.onAssemble(async (assembly, _context, next) => {
    assembly.sections.push({ name: "tail", text: "added" });
    return next();
  });
  await client.onAssemble((_assembly, _context, next) => next()); // a plain function
  await client.onAssemble(async (_assembly, _context, next) => await next());
  await client.onAssemble(async (_assembly, _context, next) => {
    const [returned] = await Promise.all([next()]); // a callback on next()'s promise
    return returned;
  });
  const assembly = await client.assemble();
  assert.deepEqual(ownSections(assembly), ["tail"]);
  assert.deepEqual(counts, [1, 1, 2, 2]);
});

test("a listener that raises fails the assembly naming it, and the next one succeeds", async () => {
  const client = await harness.connect();
  const off = await client.onAssemble(async function breaksThings() {
    throw new RangeError("listener broke");
  });
  const error = await failure(client.assemble());
  assert.equal(error.code, dsp.Code.ABORTED);
  assert.equal(error.reason, dsp.Reason.LISTENER_FAILED);
  assert.match(error.message, /breaksThings/);
  assert.match(error.message, /RangeError: listener broke/);
  await off();
  await client.assemble();
});

test("next() may be called once per invocation", async () => {
  const client = await harness.connect();
  await client.onAssemble(async (_assembly, _context, next) => {
    await next();
    return next();
  });
  const error = await failure(client.assemble());
  assert.equal(error.reason, dsp.Reason.LISTENER_FAILED);
  assert.match(error.message, /next\(\) may be called once per invocation/);
});

test("tools a listener hands back untouched keep their exact schemas, reordered or not", async () => {
  const client = await harness.connect();
  const parameters = { type: "object", properties: { z: { type: "integer" }, a: { type: "string" } } };
  await client.tools([
    { name: "alpha", description: "a", parameters },
    { name: "beta", description: "b", parameters: { type: "object" } },
  ]);
  await client.onAssemble((assembly, _context, next) => {
    assembly.tools.reverse();
    return next();
  });
  const assembly = await client.assemble();
  assert.deepEqual(toolNames(assembly), ["beta", "alpha"]);
  const alpha = assembly.tools[1];
  assert.ok(alpha instanceof dsp.ToolSchema);
  assert.equal(alpha.parametersJson(), JSON.stringify(parameters));
});

test("a tool changed in place reaches the rest of the chain", async () => {
  const client = await harness.connect();
  await client.tools([{ name: "alpha", description: "before", parameters: { type: "object" } }]);
  await client.onAssemble((assembly, _context, next) => {
    const [tool] = assembly.tools;
    if (tool) {
      tool.description = "after";
      tool.parameters = { type: "object", title: "changed" };
    }
    return next();
  });
  let seen: dsp.ToolSchemaLike | undefined;
  await client.onAssemble(async (assembly, _context, next) => {
    seen = assembly.tools[0];
    return next();
  });
  const assembly = await client.assemble();
  assert.equal(seen?.description, "after");
  assert.deepEqual(assembly.tools[0]?.parameters, { type: "object", title: "changed" });
});

test("a disposed listener is not invoked again", async () => {
  const client = await harness.connect();
  const log: string[] = [];
  const off = await client.onAssemble(appending("gone", log));
  await client.assemble();
  await off();
  await off();
  const assembly = await client.assemble();
  assert.deepEqual(log, ["gone"]);
  assert.deepEqual(ownSections(assembly), []);
});

test("off() sends no Dispose after the listener stream's end disposed the listener", async () => {
  const { interceptor, calls, refused } = disposeCounter();
  const client = await harness.connect({ interceptors: [interceptor] });
  const scope = await client.scope("agent");
  for (const registrar of [client, scope]) {
    const off = await registrar.onAssemble(appending("mark"));
    assert.deepEqual(ownSections(await client.assemble({ scope: "agent" })), ["mark"]);
    await off(); // half-closed: the sidecar disposed it, then ended the stream with OK
  }
  assert.deepEqual([calls(), refused], [0, []]); // it was refused NOT_FOUND after the stream's cancel
  const offSection = await client.section("plain", 1, "Plain.");
  await offSection(); // a registration without a stream of its own: one Dispose
  assert.deepEqual([calls(), refused], [1, []]);
});

test("once off() resolves, no assembly sees the listener", async () => {
  const owner = await harness.connect();
  const assembler = await harness.connect();
  for (let round = 0; round < 20; round += 1) {
    const off = await owner.onAssemble(appending("mark"));
    assert.deepEqual(ownSections(await assembler.assemble()), ["mark"]);
    await off();
    const seen = await Promise.all([owner.assemble(), assembler.assemble()]); // on its connection too
    assert.deepEqual(seen.map(ownSections), [[], []]);
  }
});

test("a listener may call its own off()", async () => {
  const { interceptor, refused } = disposeCounter();
  const owner = await harness.connect({ interceptors: [interceptor] });
  const assembler = await harness.connect();
  const outcome: string[] = [];
  const off = await owner.onAssemble(async (assembly, _context, next) => {
    await off().then(
      () => outcome.push("resolved"),
      (error: unknown) => outcome.push(String(error)),
    );
    return next(assembly);
  });
  await assembler.assemble().catch(() => undefined); // its stream ended under this assembly
  await waitFor(() => outcome.length > 0, "off() settles");
  assert.deepEqual([outcome, refused], [["resolved"], []]);
  assert.deepEqual(ownSections(await assembler.assemble()), []);
});

test("a listener may register and assemble while it is invoked", async () => {
  const client = await harness.connect();
  let inner: dsp.PromptAssembly | undefined;
  const off = await client.onAssemble(async (assembly, context, next) => {
    if (context.fields["outer"]) {
      await client.section("registered-inside", 50, "Inside.");
      inner = await client.assemble();
    }
    return next(assembly);
  });
  await client.assemble({ fields: { outer: true } });
  await off();
  assert.ok(inner !== undefined);
  assert.deepEqual(ownSections(await client.assemble()), ["registered-inside"]);
});

test("a listener's session closing removes it from other clients' assemblies", async () => {
  const owner = await harness.connect();
  const other = await harness.connect();
  await owner.onAssemble(appending("owned"));
  assert.deepEqual(ownSections(await other.assemble()), ["owned"]);
  await owner.close();
  assert.deepEqual(ownSections(await other.assemble()), []);
});
