/**
 * The TypeScript client's `assemble()` answered from its local cache (no RPC), from
 * Node. Run by `python -m bench` (figure ts_local_cache_assemble):
 *
 *     node dist/bench/local_cache.js HOST:PORT ITERATIONS WARMUP
 *
 * prints one JSON object: the durations in nanoseconds.
 */

import * as dsp from "../src/index.js";

const [address, iterations = "5000", warmup = "500"] = process.argv.slice(2);
if (address === undefined) throw new Error("usage: local_cache.js HOST:PORT [ITERATIONS] [WARMUP]");

const client = await dsp.connect(address, { clientName: "bench-ts-local", localCache: true });
try {
  for (let round = 0; round < Number(warmup); round += 1) await client.assemble();
  const durations: number[] = [];
  for (let round = 0; round < Number(iterations); round += 1) {
    const start = process.hrtime.bigint();
    await client.assemble();
    durations.push(Number(process.hrtime.bigint() - start));
  }
  console.log(JSON.stringify({ node: process.version, cached_assemble: durations }));
} finally {
  await client.close();
}
