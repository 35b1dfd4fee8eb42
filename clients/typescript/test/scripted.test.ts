/**
 * The client against a sidecar that misbehaves: it never hangs, leaks or believes a wrong
 * answer. Every test talks to the scripted sidecar (test/scripted.ts); after each, the
 * harness checks that no stream is open on it and no timer or handle of the client is
 * left in this process. The same cases as tests/client/test_scripted_sidecar.py.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as grpc from "@grpc/grpc-js";
import * as dsp from "../src/index.js";
import { bounded, failure, waitFor } from "./helpers.js";
import {
  failure as scriptedFailure,
  CALL_TIMEOUT_MS,
  invocation,
  nextResult,
  opened,
  provide,
  Script,
  silence,
  useScripted,
  wireTool,
  type End,
  type ListenerPeer,
  type SessionPeer,
} from "./scripted.js";

const harness = useScripted();

class Silent extends Script {
  override async openSession(peer: SessionPeer): Promise<void> {
    peer.holdOpen = true;
  }
  override async listen(peer: ListenerPeer): Promise<void> {
    peer.holdOpen = true;
  }
  override async watch(): Promise<void> {}
}

class SilentAfterOpening extends Script {
  override answer(_method: string, _request: unknown, call: grpc.ServerUnaryCall<unknown, unknown>): Promise<object> {
    return silence(call);
  }
}

// -- the session stream ---------------------------------------------------------------

test("a session the sidecar never confirms fails connect within the call timeout", async () => {
  harness.use(new Silent());
  const started = Date.now();
  const error = await bounded(harness.connect());
  assert.deepEqual([error.code, error.reason], [dsp.Code.UNAVAILABLE, dsp.Reason.SIDECAR_UNAVAILABLE]);
  assert.match(error.message, /opening the session/);
  assert.ok(Date.now() - started < CALL_TIMEOUT_MS + 2_000);
});

test("a session stream that does not start with opened is a protocol error", async () => {
  harness.use(
    new (class extends Script {
      override async openSession(peer: SessionPeer): Promise<void> {
        peer.holdOpen = true;
        await peer.next();
        peer.send(provide(1, "p1"));
      }
    })(),
  );
  const error = await bounded(harness.connect());
  assert.deepEqual([error.code, error.reason], [dsp.Code.INTERNAL, dsp.Reason.PROTOCOL_ERROR]);
});

test("a second opened is ignored and the session keeps its first id", async () => {
  const script = harness.use(new Script());
  const client = await harness.connect();
  const firstId = client.sessionId;
  await client.section("s", 1, () => "value");
  const session = script.sessions[0]!;
  session.send(opened("another-session"));
  session.send(provide(1, "p1"));
  const answer = await session.next();
  assert.equal(client.sessionId, firstId);
  assert.ok(answer.kind.case === "provided");
  assert.deepEqual(answer.kind.value.values[0]?.value, { case: "text", value: "value" });
});

test("a provide request for a key never registered is answered with an error", async () => {
  const script = harness.use(new Script());
  await harness.connect();
  const session = script.sessions[0]!;
  session.send(provide(7, "never-registered"));
  const answer = await session.next();
  assert.ok(answer.kind.case === "provided");
  const value = answer.kind.value.values[0];
  assert.deepEqual([answer.kind.value.callId, value?.providerKey], [7n, "never-registered"]);
  assert.ok(value?.value.case === "error");
  assert.match(value.value.value.message, /disposed/);
});

test("a provide request repeated while it runs is answered once", async () => {
  const script = harness.use(new Script());
  let release = (): void => undefined;
  const released = new Promise<void>((resolve) => (release = resolve));
  let asked = 0;
  const client = await harness.connect();
  await client.section("s", 1, async () => {
    asked += 1;
    await released;
    return "once";
  });
  const session = script.sessions[0]!;
  session.send(provide(1, "p1"));
  await waitFor(() => asked === 1, "call 1 runs");
  session.send(provide(1, "p1")); // the same call again, while it runs
  session.send(provide(2, "p1"));
  await waitFor(() => asked === 2, "call 2 runs too");
  release();
  const answers = [await session.next(), await session.next()];
  assert.deepEqual(
    answers.map((a) => (a.kind.case === "provided" ? a.kind.value.callId : -1n)).sort(),
    [1n, 2n],
  );
  await assert.rejects(session.take(300), /nothing from the client/); // call 1 was answered once
  assert.equal(asked, 2);
});

test("provide fields that are not JSON are answered with an error", async () => {
  const script = harness.use(new Script());
  const client = await harness.connect();
  await client.section("s", 1, () => "never asked");
  const session = script.sessions[0]!;
  session.send(provide(1, "p1", "{not json"));
  const answer = await session.next();
  assert.ok(answer.kind.case === "provided");
  const value = answer.kind.value.values[0]?.value;
  assert.ok(value?.case === "error");
  assert.match(value.value.message, /JSON/);
});

// -- unary calls ----------------------------------------------------------------------

test("a registration the sidecar never answers fails, and the session is made again", async () => {
  const script = harness.use(new SilentAfterOpening());
  const client = await harness.connect();
  const error = await bounded(client.section("s", 1, "text"));
  assert.deepEqual([error.code, error.reason], [dsp.Code.UNAVAILABLE, dsp.Reason.SIDECAR_UNAVAILABLE]);
  assert.match(error.message, /RegisterSection/);
  // It may be registered on that session: a new session leaves nothing of it.
  await waitFor(() => script.sessions.length >= 2, "a new session is opened");
  await script.sessions[0]!.ended;
});

test("an assembly the sidecar never answers fails at its timeout", async () => {
  harness.use(new SilentAfterOpening());
  const client = await harness.connect();
  const error = await bounded(client.assemble({ timeoutMs: 300 }));
  assert.deepEqual([error.code, error.reason], [dsp.Code.DEADLINE_EXCEEDED, dsp.Reason.UNKNOWN]);
});

// -- errors ---------------------------------------------------------------------------

/** Refuses every Assemble with `end`. */
class Refuses extends Script {
  constructor(readonly end: End) {
    super();
  }
  override answer(method: string, request: unknown, call: grpc.ServerUnaryCall<unknown, unknown>): Promise<object> {
    if (method === "Assemble") return Promise.reject(failureOf(this.end));
    return super.answer(method, request, call);
  }
}

function failureOf(end: End): Partial<grpc.StatusObject> {
  const metadata = new grpc.Metadata();
  return end.reason === undefined
    ? { code: end.code, details: end.message ?? "", metadata }
    : { ...scriptedFailure(end) };
}

test("an error without ErrorInfo has the reason UNKNOWN", async () => {
  harness.use(new Refuses({ code: grpc.status.FAILED_PRECONDITION, message: "no reason given" }));
  const client = await harness.connect();
  const error = await bounded(client.assemble());
  assert.deepEqual([error.code, error.reason, error.message], [dsp.Code.FAILED_PRECONDITION, "UNKNOWN", "no reason given"]);
});

test("an UNAVAILABLE error without a reason is SIDECAR_UNAVAILABLE", async () => {
  harness.use(new Refuses({ code: grpc.status.UNAVAILABLE, message: "a proxy says no" }));
  const client = await harness.connect();
  const error = await bounded(client.assemble());
  assert.deepEqual([error.code, error.reason], [dsp.Code.UNAVAILABLE, dsp.Reason.SIDECAR_UNAVAILABLE]);
});

test("an error with a huge message still arrives with its code and reason, and the client keeps working", async () => {
  // 60 kB: Node's HTTP/2 (the scripted sidecar's) sends no trailers past its 64 KiB header block.
  harness.use(new Refuses({ code: grpc.status.ABORTED, message: "x".repeat(60_000), reason: "PROVIDER_FAILED" }));
  const client = await harness.connect();
  const error = await bounded(client.assemble());
  assert.equal(error.code, dsp.Code.ABORTED);
  assert.equal(error.reason, dsp.Reason.PROVIDER_FAILED);
  assert.ok(error.message.length <= 60_000);
  assert.equal(typeof (await client.section("still", 1, "works")), "function");
});

// -- the listener stream --------------------------------------------------------------

const passThrough: dsp.Listener = async (_assembly, _context, next) => {
  const result = await next();
  return result;
};

/** A listener that awaits next() and keeps what it raised, and whether it ended. */
class Caught {
  raised: unknown;
  ended = false;
  readonly listener: dsp.Listener = async (_assembly, _context, next) => {
    try {
      return await next();
    } catch (error) {
      this.raised = error;
      throw error;
    } finally {
      this.ended = true;
    }
  };
}

/** The listener's stream, after an invocation with `tools` whose next() was sent. */
async function invoked(script: Script, ...tools: ReturnType<typeof wireTool>[]): Promise<ListenerPeer> {
  const stream = script.listeners.at(-1)!;
  stream.send(invocation(1, ...tools));
  const sent = await stream.next();
  assert.equal(sent.kind.case, "next");
  return stream;
}

test("a listener the sidecar never confirms fails within the call timeout", async () => {
  harness.use(
    new (class extends Script {
      override async listen(peer: ListenerPeer): Promise<void> {
        peer.holdOpen = true;
      }
    })(),
  );
  const client = await harness.connect();
  const error = await bounded(client.onAssemble(passThrough));
  assert.deepEqual([error.code, error.reason], [dsp.Code.UNAVAILABLE, dsp.Reason.SIDECAR_UNAVAILABLE]);
  assert.match(error.message, /listener/);
});

test("a listener stream that does not start with registered is a protocol error", async () => {
  harness.use(
    new (class extends Script {
      override async listen(peer: ListenerPeer): Promise<void> {
        peer.holdOpen = true;
        await peer.next();
        peer.send(invocation(1));
      }
    })(),
  );
  const client = await harness.connect();
  const error = await bounded(client.onAssemble(passThrough));
  assert.equal(error.reason, dsp.Reason.PROTOCOL_ERROR);
});

test("a next_result for an unknown invocation is ignored", async () => {
  const script = harness.use(new Script());
  const caught = new Caught();
  const client = await harness.connect();
  await client.onAssemble(caught.listener);
  const stream = await invoked(script);
  stream.send(nextResult(99, []));
  stream.send(nextResult(1, []));
  const reply = await stream.next();
  assert.ok(reply.kind.case === "result");
  assert.equal(reply.kind.value.invocationId, 1n);
  assert.equal(caught.raised, undefined);
});

for (const [label, slots, tools] of [
  ["past the tools", [5], []],
  ["below minus one", [-2], []],
  ["a new tool too many", [0], [wireTool("extra")]],
  ["a new tool missing", [-1, -1], [wireTool("one")]],
] as const) {
  test(`tool slots that cannot be right fail next() with a protocol error: ${label}`, async () => {
    const script = harness.use(new Script());
    const caught = new Caught();
    const client = await harness.connect();
    await client.onAssemble(caught.listener);
    const stream = await invoked(script, wireTool("t0"));
    stream.send(nextResult(1, [...slots], ...tools));
    const reply = await stream.next();
    assert.ok(caught.raised instanceof dsp.SystemPromptError);
    assert.equal(caught.raised.reason, dsp.Reason.PROTOCOL_ERROR);
    assert.ok(reply.kind.case === "failure");
    assert.match(reply.kind.value.message, /protocol error/);
  });
}

for (const end of [
  { code: grpc.status.OK },
  { code: grpc.status.UNAVAILABLE, message: "going away" },
  { code: grpc.status.INTERNAL, message: "bug" },
]) {
  test(`a listener stream ended under next() (${grpc.status[end.code]}) ends the call and installs it again`, async () => {
    const script = harness.use(new Script());
    const caught = new Caught();
    const client = await harness.connect();
    await client.onAssemble(caught.listener);
    const stream = await invoked(script);
    stream.end(end);
    await waitFor(() => caught.ended, "the listener's call ends");
    assert.ok(caught.raised instanceof dsp.SystemPromptError);
    assert.equal(caught.raised.code, dsp.Code.CANCELLED);
    // The sidecar dropped the listener's stream: it is installed again on the same session,
    // which keeps its other registrations (issue 34: a new session was made).
    await waitFor(
      () => client.connected && script.listeners.length === 2 && script.listeners[1]!.start !== undefined,
      "the listener is installed again on the same session",
    );
    assert.equal(script.sessions.length, 1);
    const start = script.listeners[1]!.start;
    assert.ok(start?.kind.case === "start");
    assert.equal(start.kind.value.sessionId, client.sessionId);
  });
}

test("a repeated invocation id runs the listener once", async () => {
  const script = harness.use(new Script());
  let calls = 0;
  let release = (): void => undefined;
  const released = new Promise<void>((resolve) => (release = resolve));
  const client = await harness.connect();
  await client.onAssemble(async (assembly) => {
    calls += 1;
    await released;
    return assembly;
  });
  const stream = script.listeners[0]!;
  stream.send(invocation(1));
  await waitFor(() => calls === 1, "the listener runs");
  stream.send(invocation(1));
  stream.send(invocation(2));
  await waitFor(() => calls === 2, "the second invocation runs");
  release();
  const replies = [await stream.next(), await stream.next()];
  assert.deepEqual(
    replies.map((r) => (r.kind.case === "result" ? r.kind.value.invocationId : -1n)).sort(),
    [1n, 2n],
  );
  await assert.rejects(stream.take(300), /nothing from the client/);
  assert.equal(calls, 2);
});

// -- replay ---------------------------------------------------------------------------

type Misstep = "end the session" | "cut the session" | "refuse" | "never answer";

/** Sessions as usual, but the first registration replayed on the second session meets `misstep`. */
class Replay extends Script {
  readonly ids: string[] = [];
  constructor(public misstep: Misstep | "") {
    super();
  }
  override async openSession(peer: SessionPeer): Promise<void> {
    peer.start = await peer.next();
    this.ids.push(this.newId("session-"));
    peer.send(opened(this.ids.at(-1)!));
  }
  override async answer(method: string, request: unknown, call: grpc.ServerUnaryCall<unknown, unknown>): Promise<object> {
    const sessionId = (request as { sessionId?: string }).sessionId;
    if (this.ids.length === 2 && sessionId === this.ids[1] && this.misstep) {
      const misstep = this.misstep;
      this.misstep = "";
      const session = this.sessions[1]!;
      if (misstep === "end the session") {
        session.end();
        await session.ended;
      } else if (misstep === "cut the session") {
        session.end({ code: grpc.status.UNAVAILABLE, message: "restarting" });
        await session.ended;
      } else if (misstep === "refuse") {
        throw scriptedFailure({ code: grpc.status.ALREADY_EXISTS, message: "taken", reason: "DUPLICATE_NAME" });
      } else {
        return silence(call);
      }
    }
    return super.answer(method, request, call);
  }
  namesOn(sessionId: string): string[] {
    return this.unary.filter(([m, r]) => m === "RegisterSection" && r.sessionId === sessionId).map(([, r]) => r.name ?? "");
  }
}

for (const misstep of ["end the session", "cut the session", "refuse", "never answer"] as const) {
  test(`a replay that goes wrong (${misstep}) is done again on a new session`, async () => {
    const script = harness.use(new Replay(misstep));
    const client = await harness.connect();
    await client.section("a", 1, "A");
    await client.section("b", 2, "B");
    script.sessions[0]!.end({ code: grpc.status.UNAVAILABLE, message: "restarting" });
    await waitFor(() => script.ids.length === 3 && client.connected, "a third session replays", 10_000);
    assert.equal(client.sessionId, script.ids[2]);
    assert.deepEqual(script.namesOn(script.ids[2]!), ["a", "b"]);
    // The second session, whatever happened to it, is over: no orphan keeps "a".
    await script.sessions[1]!.ended;
    await waitFor(() => harness.sidecar.openStreams === 1, "only the third session is open");
  });
}
