/**
 * Version skew: the client with an older and a newer (scripted) sidecar. Each side uses
 * only what both support and ignores what it does not know (docs/protocol.md, "Versions
 * and features"). The same cases as tests/wire/test_version_skew.py.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { create } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import * as dsp from "../src/index.js";
import * as pb from "../src/gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { failure } from "./helpers.js";
import {
  failure as scriptedFailure,
  invocation,
  nextResult,
  opened,
  registered,
  Script,
  useScripted,
  wireTool,
  withUnknownField,
  type ListenerPeer,
  type SessionPeer,
  type WatchPeer,
} from "./scripted.js";

const harness = useScripted();

/** The release before feature negotiation: no versions, no features, every next_result slot-encoded. */
class Older extends Script {
  override async openSession(peer: SessionPeer): Promise<void> {
    peer.start = await peer.next();
    peer.send(opened(this.newId("session-")));
  }
  override async listen(peer: ListenerPeer): Promise<void> {
    peer.start = await peer.next();
    peer.send(registered(this.newId("listener-")));
  }
}

/** A later release: features, fields, message kinds and values this client lacks. */
class Newer extends Script {
  override sessionFeatures = ["tool-slots", "delta-hops", "something-else"];
  override listenerFeatures = ["tool-slots", "delta-hops"];
  override async openSession(peer: SessionPeer): Promise<void> {
    peer.start = await peer.next();
    const first = opened(this.newId("session-"), { sidecarVersion: "dsh-system-prompt/99.0", features: this.sessionFeatures });
    peer.send(withUnknownField(first));
    peer.send(withUnknownField(create(pb.OpenSessionResponseSchema), 60)); // a new kind of message
  }
  override async listen(peer: ListenerPeer): Promise<void> {
    peer.start = await peer.next();
    peer.send(withUnknownField(registered(this.newId("listener-"), { features: this.listenerFeatures })));
    peer.send(withUnknownField(create(pb.ListenResponseSchema), 60));
  }
  override async watch(peer: WatchPeer): Promise<void> {
    await super.watch(peer);
    peer.send(withUnknownField(create(pb.WatchChangesResponseSchema), 60));
  }
  override async answer(method: string, request: unknown, call: grpc.ServerUnaryCall<unknown, unknown>): Promise<object> {
    if (method === "Assemble" && (request as pb.AssembleRequest).render) {
      throw scriptedFailure({ code: grpc.status.FAILED_PRECONDITION, message: "new rule", reason: "A_NEWER_REASON" });
    }
    return withUnknownField(await super.answer(method, request, call));
  }
}

function toolsOf(assembly: pb.PromptAssembly | undefined): string[] {
  return (assembly?.tools ?? []).map((tool) => tool.name);
}

test("an older sidecar gets full tools, and its unasked slots are still read", async () => {
  const script = harness.use(new Older());
  const seen: string[][] = [];
  const client = await harness.connect();
  await client.onAssemble(async (assembly, _context, next) => {
    assembly.tools.push(new dsp.ToolSchema("mine", "added here", {}));
    const result = await next();
    seen.push(result.tools.map((tool) => tool.name));
    return result;
  });
  const stream = script.listeners[0]!;
  stream.send(invocation(1, wireTool("t0"), wireTool("t1")));
  const sentNext = await stream.next();
  assert.ok(sentNext.kind.case === "next");
  // Slot-encoded, as that release always did: t1 unchanged, then one new tool.
  stream.send(nextResult(1, [1, -1], wireTool("late")));
  const result = await stream.next();
  assert.ok(result.kind.case === "result");
  assert.deepEqual([sentNext.kind.value.toolSlots, result.kind.value.toolSlots], [[], []]);
  assert.deepEqual(toolsOf(sentNext.kind.value.assembly), ["t0", "t1", "mine"]);
  assert.deepEqual(seen, [["t1", "late"]]);
  assert.deepEqual(toolsOf(result.kind.value.assembly), ["t1", "late"]);
});

test("an older sidecar without versions or features serves a client", async () => {
  const script = harness.use(new Older());
  const client = await harness.connect();
  await client.section("s", 1, "text");
  assert.ok(client.sessionId);
  const start = script.sessions[0]!.start;
  assert.ok(start?.kind.case === "start");
  assert.match(start.kind.value.clientVersion, /^dsh-system-prompt-typescript\//);
});

test("a newer sidecar's unknown features, fields and messages are ignored, and tool-slots among them is used", async () => {
  const script = harness.use(new Newer());
  const client = await harness.connect();
  await client.section("s", 1, () => "value");
  await client.onAssemble(async (_assembly, _context, next) => await next());
  const [session, stream] = [script.sessions[0]!, script.listeners[0]!];
  session.send(
    withUnknownField(
      create(pb.OpenSessionResponseSchema, {
        kind: { case: "provide", value: { callId: 1n, calls: [{ providerKey: "p1", kind: pb.ProviderKind.SECTION }] } },
      }),
    ),
  );
  const answer = await session.next();
  stream.send(withUnknownField(invocation(1, wireTool("t0"))));
  const sentNext = await stream.next();
  stream.send(nextResult(1, [0]));
  const result = await stream.next();
  const assembly = await client.assemble();
  assert.ok(answer.kind.case === "provided");
  assert.deepEqual(answer.kind.value.values[0]?.value, { case: "text", value: "value" });
  assert.ok(sentNext.kind.case === "next" && result.kind.case === "result");
  assert.deepEqual([sentNext.kind.value.toolSlots, result.kind.value.toolSlots], [[0], [0]]);
  assert.deepEqual(assembly, { sections: [], contexts: [], tools: [], variables: {} });
});

test("a newer sidecar's unknown reason is kept as its string", async () => {
  harness.use(new Newer());
  const client = await harness.connect();
  const error = await failure(client.render());
  assert.deepEqual([error.code, error.reason], [dsp.Code.FAILED_PRECONDITION, "A_NEWER_REASON"]);
});

test("a newer sidecar's unknown change kinds and actions read as unknown", async () => {
  const script = harness.use(new Newer());
  const client = await harness.connect();
  const changes = await client.watchChanges();
  script.watchers[0]!.send(
    create(pb.WatchChangesResponseSchema, {
      kind: { case: "event", value: { revision: 11n, name: "n", kind: 99 as pb.ChangeKind, action: 98 as pb.ChangeAction } },
    }),
  );
  const item = await changes.next();
  changes.close();
  assert.ok(!item.done && item.value.type === "change");
  assert.deepEqual(
    [item.value.revision, item.value.kind, item.value.action, item.value.name, item.value.scope],
    [11, "unknown", "unknown", "n", undefined],
  );
});

test("a newer sidecar's unknown provider kind is answered with an error", async () => {
  const script = harness.use(new Newer());
  const client = await harness.connect();
  await client.section("s", 1, () => "text");
  const session = script.sessions[0]!;
  session.send(
    create(pb.OpenSessionResponseSchema, {
      kind: { case: "provide", value: { callId: 1n, calls: [{ providerKey: "p1", kind: 42 as pb.ProviderKind }] } },
    }),
  );
  const answer = await session.next();
  assert.ok(answer.kind.case === "provided");
  const value = answer.kind.value.values[0]?.value;
  assert.ok(value?.case === "error");
  assert.match(value.value.message, /kind 42/);
});

test("a newer sidecar's unknown report values read as unknown", async () => {
  harness.use(
    new (class extends Newer {
      override async answer(method: string, request: unknown, call: grpc.ServerUnaryCall<unknown, unknown>): Promise<object> {
        const reply = await super.answer(method, request, call);
        if (method !== "Assemble") return reply;
        return create(pb.AssembleResponseSchema, {
          report: { parts: [{ name: "new", kind: 77 as pb.PartKind, source: { kind: 78 as pb.SourceKind } }] },
        });
      }
    })(),
  );
  const client = await harness.connect();
  const assembly = await client.assemble({ report: true });
  const part = assembly.report?.parts[0];
  assert.deepEqual([part?.kind, part?.source.kind, part?.name], ["unknown", "unknown", "new"]);
});
