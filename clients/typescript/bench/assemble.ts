/**
 * The TypeScript client's `assemble()` against an empty unary RPC (grpc.health.v1
 * Health/Check on a channel of its own to the same sidecar), interleaved, from Node.
 * Run by `python -m bench` (figure ts_client_assemble):
 *
 *     node dist/bench/assemble.js HOST:PORT ITERATIONS WARMUP
 *
 * prints one JSON object: each operation's durations in nanoseconds.
 */

import * as grpc from "@grpc/grpc-js";
import * as dsp from "../src/index.js";

type Operation = () => Promise<unknown>;

const [address, iterations = "2000", warmup = "200"] = process.argv.slice(2);
if (address === undefined) throw new Error("usage: assemble.js HOST:PORT [ITERATIONS] [WARMUP]");

/** The empty RPC: Health/Check with an empty request, its answer left undecoded. */
function healthCheck(channel: grpc.Client): Operation {
  const empty = Buffer.alloc(0);
  return () =>
    new Promise((resolve, reject) => {
      channel.makeUnaryRequest(
        "/grpc.health.v1.Health/Check",
        (request: Buffer) => request,
        (response: Buffer) => response,
        empty,
        (error, response) => (error ? reject(error) : resolve(response)),
      );
    });
}

/** Time each operation, rotating the order every round so no one always runs after another. */
async function interleaved(operations: Record<string, Operation>, rounds: number, skip: number): Promise<Record<string, number[]>> {
  const names = Object.keys(operations);
  const durations: Record<string, number[]> = Object.fromEntries(names.map((name) => [name, []]));
  for (let round = 0; round < skip + rounds; round += 1) {
    const shift = round % names.length;
    for (const name of [...names.slice(shift), ...names.slice(0, shift)]) {
      const operation = operations[name];
      if (operation === undefined) continue;
      const start = process.hrtime.bigint();
      await operation();
      const elapsed = Number(process.hrtime.bigint() - start);
      if (round >= skip) durations[name]?.push(elapsed);
    }
  }
  return durations;
}

const client = await dsp.connect(address, { clientName: "bench-ts-client" });
const channel = new grpc.Client(address, grpc.credentials.createInsecure());
try {
  const samples = await interleaved(
    { client_assemble: () => client.assemble(), empty_rpc: healthCheck(channel) },
    Number(iterations),
    Number(warmup),
  );
  console.log(JSON.stringify({ node: process.version, ...samples }));
} finally {
  channel.close();
  await client.close();
}
