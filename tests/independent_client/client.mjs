// An independent client of the dsh-system-prompt sidecar, written from the
// proto and docs/ alone (issue 12): it exercises every kind of call against a
// real sidecar and prints one JSON line of what it observed.
//
// Usage: node client.mjs HOST:PORT [ejection|ignore]
import { fileURLToPath } from "node:url";
import path from "node:path";
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const REPO_PROTO = path.resolve(HERE, "..", "..", "proto");
const LOCAL_PROTO = path.join(HERE, "proto");
const CALL_TIMEOUT_MS = 10_000;
const ERROR_DOMAIN = "dsh.systemprompt.v1";
// What the session holds when it closes: a variable, three global parts, a
// scope handle and its section, two listeners.
const LIVE_AT_CLOSE = 9;
const ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo";

const LOAD_OPTIONS = {
  keepCase: true, // field names exactly as in the proto
  longs: String, // uint64 revisions and ids as decimal strings
  enums: String, // enum values by name
  defaults: true,
  oneofs: true, // each oneof's case as a virtual field
  includeDirs: [REPO_PROTO, LOCAL_PROTO],
};

const definition = protoLoader.loadSync(
  ["dsh/systemprompt/v1/system_prompt.proto", "google/rpc/status_details.proto"],
  LOAD_OPTIONS,
);
const loaded = grpc.loadPackageDefinition(definition);
const Service = loaded.dsh.systemprompt.v1.SystemPromptService;
const codec = definition["google.rpc.DetailsCodec"].Decode;

// -- errors -------------------------------------------------------------------

/** The stable reason of a failed call: from ErrorInfo, and from the trailer. */
function reasonOf(error) {
  const trailer = error.metadata?.get("dsh-error-reason")[0] ?? null;
  let info = null;
  const details = error.metadata?.get("grpc-status-details-bin")[0];
  if (details) {
    const status = codec.requestDeserialize(details);
    const any = status.details.find((detail) => detail.type_url === ERROR_INFO_TYPE);
    if (any) info = codec.responseDeserialize(any.value);
  }
  return {
    code: grpc.status[error.code] ?? String(error.code),
    message: error.details,
    reason: info?.reason ?? trailer ?? "UNKNOWN",
    info_reason: info?.reason ?? null,
    info_domain: info?.domain ?? null,
    trailer_reason: trailer,
  };
}

/** Runs `call` expecting a failure; the failure's code and reasons. */
async function rejection(call) {
  try {
    await call();
  } catch (error) {
    if (error.code === undefined) throw error;
    return reasonOf(error);
  }
  throw new Error("the call succeeded where a failure was expected");
}

// -- unary calls --------------------------------------------------------------

function deadline() {
  return new Date(Date.now() + CALL_TIMEOUT_MS);
}

function unary(stub, method, request) {
  return new Promise((resolve, reject) => {
    stub[method](request, new grpc.Metadata(), { deadline: deadline() }, (error, response) =>
      error ? reject(error) : resolve(response),
    );
  });
}

// -- a one-shot queue for stream messages -------------------------------------

/** Resolves the first message of `stream` that `match` accepts. */
function nextMessage(stream, match, what) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => done(new Error(`timed out waiting for ${what}`)), CALL_TIMEOUT_MS);
    const onData = (message) => {
      if (match(message)) done(null, message);
    };
    const onEnd = (error) => done(error ?? new Error(`stream ended before ${what}`));
    function done(error, message) {
      clearTimeout(timer);
      stream.off("data", onData);
      stream.off("error", onEnd);
      stream.off("end", onEnd);
      error ? reject(error) : resolve(message);
    }
    stream.on("data", onData);
    stream.on("error", onEnd);
    stream.on("end", () => onEnd());
  });
}

/** The final status of a stream (OK included), once it ends. */
function finalStatus(stream) {
  return new Promise((resolve) => {
    stream.on("status", (status) =>
      resolve({ code: grpc.status[status.code], details: status.details, metadata: status.metadata }),
    );
    stream.on("error", () => {}); // the status event carries the same failure
  });
}

// -- the session --------------------------------------------------------------

/** Opens a session; `providers` maps provider_key to (kind, context) => ProvidedValue case. */
async function openSession(stub, name, providers) {
  const stream = stub.OpenSession(new grpc.Metadata());
  const status = finalStatus(stream);
  const provideLog = [];
  stream.on("data", async (message) => {
    if (message.kind !== "provide") return; // opened is awaited below; cancel needs no work here
    const request = message.provide;
    provideLog.push({
      call_id: request.call_id,
      calls: request.calls.map((call) => [call.provider_key, call.kind]),
      timeout_s: request.timeout_s,
    });
    const fields = JSON.parse(request.context.fields_json || "{}");
    const values = await Promise.all(
      request.calls.map(async ({ provider_key, kind }) => {
        const provider = providers.get(provider_key);
        if (!provider) return { provider_key, error: { message: `no provider ${provider_key}` } };
        try {
          return { provider_key, ...(await provider(kind, request.context, fields)) };
        } catch (error) {
          return { provider_key, error: { message: String(error.message ?? error) } };
        }
      }),
    );
    stream.write({ provided: { call_id: request.call_id, values } });
  });
  const opened = nextMessage(stream, (m) => m.kind === "opened", "SessionOpened");
  stream.write({ start: { client_name: name, client_version: "independent-node/0", features: [] } });
  const { opened: session } = await opened;
  return { stream, status, provideLog, id: session.session_id, revision: session.revision };
}

// -- listeners ----------------------------------------------------------------

/**
 * Installs a waterfall listener. `handler(assembly, context, next)` returns
 * either an assembly (its final value) or `{ tail: assembly }` to hand the rest
 * of the chain's result on untouched; `await next(assembly)` runs the rest.
 */
async function listen(
  stub,
  { sessionId, scopeId = "", prepend = false, global = false, name, failurePolicy = "FAILURE_POLICY_UNSPECIFIED" },
  handler,
) {
  const stream = stub.Listen(new grpc.Metadata());
  const status = finalStatus(stream);
  const waiting = new Map(); // invocation_id -> resolve of next()'s result
  const seen = [];
  stream.on("data", async (message) => {
    if (message.kind === "next_result") {
      const { invocation_id, assembly } = message.next_result;
      waiting.get(invocation_id)?.(assembly);
      waiting.delete(invocation_id);
      return;
    }
    if (message.kind === "cancel") {
      waiting.delete(message.cancel.invocation_id);
      return;
    }
    if (message.kind !== "invocation") return;
    const { invocation_id, assembly, context } = message.invocation;
    seen.push(assembly);
    const next = (handed) =>
      new Promise((resolve) => {
        waiting.set(invocation_id, resolve);
        stream.write({ next: { invocation_id, assembly: handed, tail: false, tool_slots: [] } });
      });
    try {
      const outcome = await handler(assembly, context, next);
      if (outcome && outcome.tail) {
        stream.write({ next: { invocation_id, assembly: outcome.tail, tail: true, tool_slots: [] } });
      } else {
        stream.write({ result: { invocation_id, assembly: outcome, tool_slots: [] } });
      }
    } catch (error) {
      stream.write({ failure: { invocation_id, message: String(error.message ?? error) } });
    }
  });
  const registered = nextMessage(stream, (m) => m.kind === "registered", "ListenerRegistered");
  stream.write({
    start: {
      session_id: sessionId,
      scope_id: scopeId,
      prepend,
      global,
      name,
      features: [],
      failure_policy: failurePolicy,
    },
  });
  const { registered: confirmation } = await registered;
  return { stream, status, seen, registrationId: confirmation.registration_id, features: confirmation.features };
}

// -- change events ------------------------------------------------------------

async function watch(stub) {
  const stream = stub.WatchChanges({});
  const events = [];
  const waiters = [];
  stream.on("data", (message) => {
    if (message.kind !== "event") return;
    events.push(message.event);
    for (const waiter of [...waiters]) waiter();
  });
  stream.on("error", () => {}); // cancelled at the end
  const { subscribed } = await nextMessage(stream, (m) => m.kind === "subscribed", "WatchSubscribed");
  /** Resolves once `check(events)` holds. */
  const until = (check, what) =>
    new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no change events for ${what}`)), CALL_TIMEOUT_MS);
      const waiter = () => {
        if (!check(events)) return;
        clearTimeout(timer);
        waiters.splice(waiters.indexOf(waiter), 1);
        resolve(events);
      };
      waiters.push(waiter);
      waiter();
    });
  return { stream, events, until, revision: subscribed.revision };
}

// -- the run ------------------------------------------------------------------

function names(list) {
  return list.map((item) => item.name);
}

async function run(address) {
  const results = {};
  const stub = new Service(address, grpc.credentials.createInsecure());
  const watcher = await watch(stub);
  results.watch_subscribed_revision = watcher.revision;

  // A session whose only dynamic provider is the "cwd" section.
  const providers = new Map([
    ["cwd-text", async (kind, _context, fields) => ({ text: `cwd: ${fields.cwd ?? "(unknown)"}` })],
  ]);
  const session = await openSession(stub, "independent-client", providers);
  const sid = session.id;
  results.session_opened = Boolean(sid);

  const model = await unary(stub, "RegisterVariable", { session_id: sid, name: "model", value: "deepseek-v4" });
  await unary(stub, "RegisterSection", {
    session_id: sid, name: "rules", order: 10, text: "You run on {{model}}. Be precise.",
  });
  await unary(stub, "RegisterSection", {
    session_id: sid, name: "cwd", order: 20, dynamic: { provider_key: "cwd-text" },
  });
  await unary(stub, "RegisterContext", { session_id: sid, name: "clock", order: 1, text: "Model: {{model}}" });
  await unary(stub, "RegisterTools", {
    session_id: sid,
    name: "builtin-tools",
    result: {
      schemas: [
        { name: "todo_write", description: "write the todo list", parameters_json: '{"type":"object"}' },
        { name: "bash", description: "run a command", parameters_json: '{"type":"object"}' },
      ],
    },
  });
  const scope = await unary(stub, "OpenScope", { session_id: sid, key: "agent-1", parent_key: "" });
  const shadow = await unary(stub, "RegisterSection", {
    session_id: sid, scope_id: scope.scope_id, name: "rules", order: 10, text: "Agent 1 rules.",
  });
  results.revisions_grow = BigInt(shadow.revision) > BigInt(model.revision);
  results.variable_revision = model.revision;

  // Listener 1: hands a note to next(), then post-processes what the rest returned.
  const postProcessor = await listen(stub, { sessionId: sid, name: "post-processor" }, async (assembly, _ctx, next) => {
    const handed = { ...assembly, sections: [...assembly.sections, { name: "note", text: "Note for {{model}}." }] };
    const result = await next(handed);
    return {
      ...result,
      sections: result.sections.map((s) => (s.name === "cwd" ? { ...s, text: `${s.text} (checked)` } : s)),
    };
  });
  // Listener 2: adds a section and tail-calls: the rest's result is final.
  const tailCaller = await listen(stub, { sessionId: sid, name: "tail-caller" }, async (assembly) => ({
    tail: { ...assembly, sections: [...assembly.sections, { name: "tail", text: "Tail listener was here." }] },
  }));

  await watcher.until(
    (events) => events.some((e) => e.kind === "CHANGE_KIND_LISTENER" && e.name === "tail-caller"),
    "the registrations",
  );
  results.events_registered = watcher.events
    .filter((e) => e.action === "CHANGE_ACTION_REGISTERED")
    .map((e) => [e.kind, e.name, e.scope]);
  results.variable_event_revision = watcher.events.find((e) => e.name === "model")?.revision ?? null;
  results.events_in_order = watcher.events.every(
    (e, i) => BigInt(e.revision) > BigInt(i === 0 ? watcher.revision : watcher.events[i - 1].revision),
  );

  // Assemble for the scope, rendered on the sidecar.
  const scoped = await unary(stub, "Assemble", {
    context: { scope: "agent-1", fields_json: JSON.stringify({ cwd: "/work" }) },
    render: true,
  });
  results.scoped_sections = names(scoped.assembly.sections);
  results.scoped_tools = names(scoped.assembly.tools);
  results.scoped_variables = scoped.assembly.variables.map((v) => [v.name, v.value]);
  results.scoped_prompt = scoped.rendered.prompt;
  results.scoped_context_snapshot = scoped.rendered.context_snapshot;
  results.tail_listener_saw_note = names(tailCaller.seen.at(-1).sections).includes("note");
  results.provide_requests = session.provideLog;

  const global = await unary(stub, "Assemble", { context: { scope: "", fields_json: "" }, render: true });
  results.global_prompt = global.rendered.prompt;

  // Failures, each with its reason from ErrorInfo and the trailer.
  results.duplicate_name = await rejection(() =>
    unary(stub, "RegisterSection", { session_id: sid, name: "rules", order: 5, text: "again" }),
  );
  results.bad_variable_name = await rejection(() =>
    unary(stub, "RegisterVariable", { session_id: sid, name: "Bad-Name", value: "x" }),
  );
  const broken = await unary(stub, "OpenScope", { session_id: sid, key: "broken", parent_key: "" });
  await unary(stub, "RegisterSection", {
    session_id: sid, scope_id: broken.scope_id, name: "oops", order: 30, text: "Hello {{nope}}",
  });
  results.render_failure = await rejection(() =>
    unary(stub, "Assemble", { context: { scope: "broken", fields_json: "" }, render: true }),
  );
  // Disposing the scope handle disposes what was registered through it.
  await unary(stub, "Dispose", { session_id: sid, registration_id: broken.scope_id });
  const repaired = await unary(stub, "Assemble", { context: { scope: "broken", fields_json: "" }, render: true });
  results.broken_scope_disposed = !names(repaired.assembly.sections).includes("oops");

  // Close cleanly: half-close, then the sidecar disposes and ends with OK.
  const before = watcher.events.length;
  session.stream.end();
  const closed = await session.status;
  results.session_end_status = closed.code;
  results.listener_end_statuses = [
    (await postProcessor.status).code,
    (await tailCaller.status).code,
  ];
  // Change events are a separate stream: they may arrive after the session's OK.
  const unregistered = (events) =>
    events.slice(before).filter((e) => e.action === "CHANGE_ACTION_UNREGISTERED");
  await watcher.until((events) => unregistered(events).length >= LIVE_AT_CLOSE, "the disposals");
  results.unregistered_after_close = unregistered(watcher.events).map((e) => [e.kind, e.name, e.scope]);

  // A second connection sees nothing of the closed session.
  const second = new Service(address, grpc.credentials.createInsecure());
  const after = await unary(second, "Assemble", {
    context: { scope: "agent-1", fields_json: JSON.stringify({ cwd: "/work" }) },
    render: true,
  });
  results.after_close_sections = names(after.assembly.sections);
  results.after_close_tools = names(after.assembly.tools);
  results.after_close_variables = names(after.assembly.variables);
  results.after_close_contexts = names(after.assembly.contexts);
  results.after_close_prompt = after.rendered.prompt;
  results.old_session_refused = await rejection(() =>
    unary(second, "RegisterSection", { session_id: sid, name: "late", order: 1, text: "late" }),
  );

  watcher.stream.cancel();
  stub.close();
  second.close();
  return results;
}

// -- an ejected listener ------------------------------------------------------

/**
 * A listener that reads its invocations and never answers: the assembly waiting for
 * it fails LISTENER_TIMEOUT, the sidecar ejects it (CallbackEjected, then the stream
 * ends with OK) and the next assembly does not wait for it (docs/protocol.md,
 * "Ejected callbacks"). Run against a sidecar with a short provider_timeout_s.
 */
async function ejection(address) {
  const results = {};
  const stub = new Service(address, grpc.credentials.createInsecure());
  const session = await openSession(stub, "independent-ejection", new Map());
  const stream = stub.Listen(new grpc.Metadata());
  const status = finalStatus(stream);
  const told = [];
  stream.on("data", (message) => {
    told.push(message.kind);
    if (message.kind === "ejected") results.ejected = message.ejected;
  });
  const registered = nextMessage(stream, (m) => m.kind === "registered", "ListenerRegistered");
  stream.write({ start: { session_id: session.id, name: "silent", features: [] } });
  const { registered: confirmation } = await registered;
  results.first = await rejection(() => unary(stub, "Assemble", {}));
  results.listener_end_status = (await status).code;
  results.told = told;
  results.ejected_the_listener = results.ejected?.registration_id === confirmation.registration_id;
  results.second_sections = names((await unary(stub, "Assemble", {})).assembly.sections);
  session.stream.end();
  await session.status;
  stub.close();
  return results;
}

// -- a listener under FAILURE_POLICY_IGNORE that fails -------------------------

/** An Assemble call's response and its trailers. */
function assembleWithTrailers(stub, request) {
  return new Promise((resolve, reject) => {
    let response;
    let failed;
    const call = stub.Assemble(request, new grpc.Metadata(), { deadline: deadline() }, (error, reply) => {
      if (error) failed = error;
      response = reply;
    });
    call.on("status", (status) =>
      failed ? reject(failed) : resolve({ response, trailers: status.metadata.getMap() }),
    );
  });
}

/**
 * A listener that decorates and declares FAILURE_POLICY_IGNORE raises; the one after
 * it adds a section. The assembly goes on without the first (docs/protocol.md,
 * "Failure policy"): AssembleResponse.skipped and the "dsh-skipped-steps" trailer
 * name it; its ref is the one the change stream gave its registration.
 */
async function ignore(address) {
  const results = {};
  const stub = new Service(address, grpc.credentials.createInsecure());
  const session = await openSession(stub, "independent-ignore", new Map());
  const changes = await watch(stub);
  const weather = await listen(
    stub,
    { sessionId: session.id, name: "weather", failurePolicy: "FAILURE_POLICY_IGNORE" },
    async () => {
      throw new Error("no weather today");
    },
  );
  await listen(stub, { sessionId: session.id, name: "sign" }, async (assembly) => ({
    ...assembly,
    sections: [...assembly.sections, { name: "signature", text: "-- the team" }],
  }));
  await changes.until((events) => events.filter((e) => e.kind === "CHANGE_KIND_LISTENER").length === 2, "listeners");
  results.weather_ref = changes.events.find((e) => e.name === "weather").ref;
  const { response, trailers } = await assembleWithTrailers(stub, { render: true });
  results.sections = names(response.assembly.sections);
  results.skipped = response.skipped;
  results.trailer = trailers["dsh-skipped-steps"] ?? null;
  results.weather_invoked = weather.seen.length;
  changes.stream.cancel();
  session.stream.end();
  await session.status;
  stub.close();
  return results;
}

const SCENARIOS = { run, ejection, ignore };
const [address, scenario = "run"] = process.argv.slice(2);
if (!address || !SCENARIOS[scenario]) {
  console.error("usage: node client.mjs HOST:PORT [ejection|ignore]");
  process.exit(2);
}
try {
  const results = await SCENARIOS[scenario](address);
  console.log(JSON.stringify({ ok: true, ...results }));
} catch (error) {
  console.log(JSON.stringify({ ok: false, error: String(error.stack ?? error), ...(error.code !== undefined ? reasonOf(error) : {}) }));
  process.exit(1);
}
