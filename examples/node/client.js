#!/usr/bin/env node
// A Node.js client of the dsh-system-prompt sidecar.
//
// It loads the contract (proto/dsh/systemprompt/v1/system_prompt.proto) at run
// time with @grpc/proto-loader, so there is no code generation step, and then:
//
//   1. subscribes to change events (WatchChanges),
//   2. opens a session (OpenSession) and answers its dynamic providers,
//   3. registers a static section, a dynamic section and a tool,
//   4. installs a waterfall listener (Listen) that adds a section,
//   5. assembles with server-side rendering (Assemble, render: true),
//   6. prints the prompt, the tools and the change events it saw,
//   7. ends its streams; ending the session disposes everything it registered.
//
// Usage:  npm ci && node client.js [HOST:PORT]      (default 127.0.0.1:50051)
//
// With the proto-loader options below, messages are plain objects whose field
// names are the .proto's snake_case names, a oneof's chosen member is named by
// a virtual property (`message.kind === 'opened'`), enums are their names as
// strings, and uint64 revisions are decimal strings.
'use strict';

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const ADDRESS = process.argv[2] || '127.0.0.1:50051';
const PROTO_ROOT = path.join(__dirname, '..', '..', 'proto');
const PROTO_FILE = path.join(PROTO_ROOT, 'dsh', 'systemprompt', 'v1', 'system_prompt.proto');
const CALL_TIMEOUT_MS = 5000;

const packageDefinition = protoLoader.loadSync(PROTO_FILE, {
  keepCase: true, // session_id, not sessionId: the names the .proto documents
  longs: String, // uint64 revisions and ids arrive as strings (no precision loss)
  enums: String, // 'CHANGE_KIND_SECTION' rather than 1
  defaults: true, // absent scalars read as '' / 0 / false, as in every proto3 runtime
  oneofs: true, // message.kind names the member a oneof holds
  includeDirs: [PROTO_ROOT],
});
const { SystemPromptService } = grpc.loadPackageDefinition(packageDefinition).dsh.systemprompt.v1;

// The sidecar's bearer token, when it is configured with `auth_token_file`,
// goes on every call and stream; an empty Metadata sends nothing.
const metadata = new grpc.Metadata();

// -- small helpers ---------------------------------------------------------------------

function deadline() {
  return new Date(Date.now() + CALL_TIMEOUT_MS);
}

// A unary call as a promise: `await unary(client, 'RegisterSection', {...})`.
function unary(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, metadata, { deadline: deadline() }, (error, response) =>
      error ? reject(error) : resolve(response),
    );
  });
}

// Resolves once a stream has finished (with any status); used for a clean close.
function finished(call) {
  return new Promise((resolve) => call.on('status', resolve));
}

function fieldsOf(context) {
  // AssembleContext.fields_json is a JSON object's text; "" means {}.
  return context.fields_json ? JSON.parse(context.fields_json) : {};
}

// -- change events ---------------------------------------------------------------------

// Subscribes to WatchChanges; resolves once the subscription is confirmed, so
// every later registration is guaranteed to show up as an event.
function watchChanges(client) {
  const call = client.WatchChanges({}, metadata);
  const events = [];
  const waiters = [];
  let seen = 0n; // the highest revision delivered so far

  const watch = {
    call,
    events,
    // Resolves once the event for `revision` (a registration's answer) arrived.
    until(revision) {
      return new Promise((resolve) => {
        if (seen >= BigInt(revision)) resolve();
        else waiters.push({ revision: BigInt(revision), resolve });
      });
    },
    close() {
      call.cancel(); // a server stream ends when its client cancels it
    },
  };

  return new Promise((resolve, reject) => {
    call.on('data', (message) => {
      switch (message.kind) {
        case 'subscribed':
          seen = BigInt(message.subscribed.revision);
          resolve(watch);
          break;
        case 'event':
          events.push(message.event);
          seen = BigInt(message.event.revision);
          break;
        case 'missed': // we fell behind: re-read whatever state we mirror
          console.error(`missed ${message.missed.count} change events`);
          seen = BigInt(message.missed.resync_revision);
          break;
      }
      for (const waiter of waiters.splice(0)) {
        if (seen >= waiter.revision) waiter.resolve();
        else waiters.push(waiter);
      }
    });
    call.on('error', (error) => {
      if (error.code !== grpc.status.CANCELLED) console.error(`change stream: ${error.message}`);
      reject(error); // no-op once subscribed
    });
  });
}

function describeEvent(event) {
  const action = event.action.replace('CHANGE_ACTION_', '').toLowerCase();
  const kind = event.kind.replace('CHANGE_KIND_', '').toLowerCase();
  const name = event.name ? ` "${event.name}"` : '';
  const scope = event.scope ? ` in scope "${event.scope}"` : '';
  return `revision ${event.revision}: ${action} ${kind}${name}${scope}`;
}

// -- the session -----------------------------------------------------------------------

// Opens a session. `providers` maps a provider_key to a function of the
// assembly's context; the sidecar asks this stream for their values at every
// assembly that needs them (ProvideRequest), and we answer on the same stream.
function openSession(client, clientName, providers) {
  const call = client.OpenSession(metadata);

  function answer(request) {
    const values = request.calls.map((providerCall) => {
      const value = { provider_key: providerCall.provider_key };
      try {
        const provider = providers.get(providerCall.provider_key);
        if (!provider) throw new Error(`no provider "${providerCall.provider_key}"`);
        // Section and context providers answer `text`; tool providers answer
        // `tools` ({schemas, known_names}); variable providers `variable_value`
        // or `no_value: {}`. This example only has text providers.
        value.text = provider(request.context);
      } catch (error) {
        value.error = { message: String(error) }; // fails that assembly, not the session
      }
      return value;
    });
    call.write({ provided: { call_id: request.call_id, values } });
  }

  return new Promise((resolve, reject) => {
    call.on('data', (message) => {
      switch (message.kind) {
        case 'opened':
          resolve({ call, sessionId: message.opened.session_id });
          break;
        case 'provide':
          answer(message.provide);
          break;
        case 'cancel': // our providers answer at once: nothing to abandon
          break;
      }
    });
    call.on('error', (error) => {
      // After it opened, a session stream only fails when the sidecar goes away
      // (and with it everything this session registered).
      console.error(`session stream: ${error.message}`);
      reject(error);
    });
    call.write({ start: { client_name: clientName } });
  });
}

// Installs a waterfall listener on its own stream. `listener(assembly, context)`
// returns the assembly to hand to the rest of the chain; we send it as
// ListenerNext with `tail: true`, which means "return whatever next() returns,
// untouched", so no ListenerNextResult comes back and one round trip is saved.
// (To post-process the chain's result instead, send `tail: false`, wait for
// `next_result`, then send a ListenerResult.)
function listen(client, start, listener) {
  const call = client.Listen(metadata);
  return new Promise((resolve, reject) => {
    call.on('data', (message) => {
      switch (message.kind) {
        case 'registered':
          resolve({ call, registrationId: message.registered.registration_id });
          break;
        case 'invocation': {
          const { invocation_id, assembly, context } = message.invocation;
          try {
            const handed = listener(assembly, context);
            call.write({ next: { invocation_id, assembly: handed, tail: true } });
          } catch (error) {
            call.write({ failure: { invocation_id, message: String(error) } });
          }
          break;
        }
        case 'cancel': // the assembly was abandoned; nothing of ours is pending
          break;
      }
    });
    call.on('error', (error) => {
      console.error(`listener stream: ${error.message}`);
      reject(error);
    });
    call.write({ start });
  });
}

// -- the example -----------------------------------------------------------------------

async function main() {
  // Keepalive pings let a long-lived session notice a vanished sidecar (and
  // the sidecar notice a vanished client) even while no call is active.
  const client = new SystemPromptService(ADDRESS, grpc.credentials.createInsecure(), {
    'grpc.keepalive_time_ms': 10000,
    'grpc.keepalive_timeout_ms': 5000,
    'grpc.keepalive_permit_without_calls': 1,
  });

  const watch = await watchChanges(client);

  const providers = new Map([
    // A dynamic section: its text is asked for at every assembly.
    ['task', (context) => `Current task: ${fieldsOf(context).task || '(none)'}.`],
  ]);
  const session = await openSession(client, 'node-example', providers);
  const sessionId = session.sessionId;
  console.log(`session opened (${ADDRESS})`);

  // A static section in the global layer (scope_id "" means global).
  const section = await unary(client, 'RegisterSection', {
    session_id: sessionId,
    name: 'node-example:rules',
    order: 10,
    text: 'Answer briefly. Prefer small, reviewable changes.',
  });
  console.log(`registered section node-example:rules (revision ${section.revision})`);

  // The dynamic section, answered by providers.get('task') above.
  await unary(client, 'RegisterSection', {
    session_id: sessionId,
    name: 'node-example:task',
    order: 20,
    dynamic: { provider_key: 'task' },
  });

  // A static tool. Its JSON Schema travels as JSON text, byte for byte.
  await unary(client, 'RegisterTools', {
    session_id: sessionId,
    name: 'node-example-tools',
    result: {
      schemas: [
        {
          name: 'read_file',
          description: 'Read a UTF-8 text file from the workspace.',
          parameters_json: JSON.stringify({
            type: 'object',
            properties: { path: { type: 'string', description: 'Path relative to the workspace.' } },
            required: ['path'],
          }),
        },
      ],
    },
  });
  console.log('registered tool read_file');

  // A listener that appends a section to every assembly.
  const listener = await listen(
    client,
    { session_id: sessionId, name: 'addNodeSection' },
    (assembly) => ({
      ...assembly,
      sections: [
        ...assembly.sections,
        { name: 'node-example:listener', text: 'This section was added by a Node.js listener.' },
      ],
    }),
  );
  console.log('installed listener addNodeSection');

  // Assemble for this caller and let the sidecar render the prompt text.
  const response = await unary(client, 'Assemble', {
    context: { scope: '', fields_json: JSON.stringify({ task: 'fix the failing test' }) },
    render: true,
  });

  console.log('\n--- rendered prompt ---');
  console.log(response.rendered.prompt);
  console.log('--- end of prompt ---');
  if (response.rendered.context_snapshot) {
    console.log(`runtime context:\n${response.rendered.context_snapshot}`);
  }
  console.log(`tools: ${response.assembly.tools.map((tool) => tool.name).join(', ')}`);

  // Change events arrive on their own stream, so they may trail the calls.
  // The assembly's revision covers every registration above: wait until the
  // change stream has delivered up to it.
  await watch.until(response.revision);
  console.log('\nchange events:');
  for (const event of watch.events) console.log(`  ${describeEvent(event)}`);

  // Clean up: stop watching, end the listener's stream, then end the session
  // (half-close); the sidecar disposes everything the session registered and
  // finishes the stream with OK.
  watch.close();
  listener.call.end();
  await finished(listener.call);
  session.call.end();
  const status = await finished(session.call);
  console.log(`\nsession closed (${grpc.status[status.code]})`);
  client.close();
}

main().catch((error) => {
  // A gRPC error has .code (grpc.status), .details (the sidecar's message) and
  // .metadata; its google.rpc.ErrorInfo reason is in the trailer
  // 'grpc-status-details-bin' (a serialized google.rpc.Status).
  const code = error.code === undefined ? '' : ` [${grpc.status[error.code]}]`;
  console.error(`error${code}: ${error.details || error.message}`);
  process.exit(1);
});
