#!/usr/bin/env node
// A Node.js agent of the dsh-system-prompt sidecar, on the TypeScript client
// package (clients/typescript, imported as @dsh/system-prompt). It
//
//   1. subscribes to change events,
//   2. connects (opens a session) and registers a static section, a dynamic
//      section and a tool,
//   3. installs a waterfall listener that adds a section,
//   4. assembles with rendering on the sidecar,
//   5. prints the prompt, the tools, the request a provider adapter makes of
//      them (dsp.openaiResponses) and the change events it saw,
//   6. closes: ending the session disposes everything it registered.
//
// Usage:  make node-deps && node client.mjs [HOST:PORT]      (default 127.0.0.1:50051)
import * as dsp from '@dsh/system-prompt';

const ADDRESS = process.argv[2] || '127.0.0.1:50051';

function describeEvent(event) {
  const name = event.name ? ` "${event.name}"` : '';
  const scope = event.scope ? ` in scope "${event.scope}"` : '';
  return `revision ${event.revision}: ${event.action} ${event.kind}${name}${scope}`;
}

async function main() {
  // The sidecar's bearer token, when it has one, goes in connect(address, {token}).
  const client = await dsp.connect(ADDRESS, { clientName: 'node-example' });
  console.log(`session opened (${ADDRESS})`);
  const changes = await client.watchChanges(); // subscribed once this resolves

  await client.section('node-example:rules', 10, 'Answer briefly. Prefer small, reviewable changes.');
  console.log('registered section node-example:rules');
  // A dynamic section: this function runs here, at every assembly, with its fields.
  await client.section('node-example:task', 20, (ctx) => `Current task: ${ctx.fields.task || '(none)'}.`);
  await client.tools(
    [
      {
        name: 'read_file',
        description: 'Read a UTF-8 text file from the workspace.',
        parameters: {
          type: 'object',
          properties: { path: { type: 'string', description: 'Path relative to the workspace.' } },
          required: ['path'],
        },
      },
    ],
  );
  console.log('registered tool read_file');

  // A listener that appends a section to every assembly; `return next()` is a tail call.
  await client.onAssemble(async function addNodeSection(assembly, ctx, next) {
    assembly.sections.push({ name: 'node-example:listener', text: 'This section was added by a Node.js listener.' });
    return next();
  });
  console.log('installed listener addNodeSection');

  const rendered = await client.render({ fields: { task: 'fix the failing test' } });
  console.log('\n--- rendered prompt ---');
  console.log(rendered.prompt);
  console.log('--- end of prompt ---');
  if (rendered.contextSnapshot) console.log(`runtime context:\n${rendered.contextSnapshot}`);
  console.log(`tools: ${rendered.assembly.tools.map((tool) => tool.name).join(', ')}`);
  // What a model call takes, through a provider adapter (OpenAI's Responses API here): the
  // prompt as instructions, tools in the assembly's order with the sidecar's schema bytes.
  const request = dsp.openaiResponses(rendered);
  console.log(`as an OpenAI Responses request: ${JSON.stringify(request.params).length} bytes`);

  // Events arrive on their own stream: read the four registrations' events.
  console.log('\nchange events:');
  let seen = 0;
  for await (const event of changes) {
    if (event.type === 'change') console.log(`  ${describeEvent(event)}`);
    if (++seen === 4) break; // also ends the subscription
  }

  await client.close();
  console.log('\nsession closed (OK)');
}

main().catch((error) => {
  // A SystemPromptError has .code (a gRPC status, dsp.Code), .reason and the sidecar's message.
  const code = error instanceof dsp.SystemPromptError ? ` [${dsp.Code[error.code]}]` : '';
  const reason = error.reason ? ` (${error.reason})` : '';
  console.error(`error${code}${reason}: ${error.message}`);
  process.exit(1);
});
