/** The client's modules import one another without a circle, type-only imports included. */

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import ts from "typescript";

// From dist/test/ (where the compiled test runs) back to the sources.
const SRC = resolve(dirname(fileURLToPath(import.meta.url)), "../../src");

/** Every module under `dir`, by its path relative to SRC, with the modules it imports. */
function importGraph(dir: string): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const entry of readdirSync(dir, { recursive: true, encoding: "utf8" })) {
    if (!entry.endsWith(".ts") || entry.endsWith(".d.ts")) continue;
    const file = join(dir, entry);
    // preProcessFile lists `import type` and `export ... from` as well as plain imports.
    const imported = ts.preProcessFile(readFileSync(file, "utf8"), true, true).importedFiles;
    const local = imported.map((i) => i.fileName).filter((name) => name.startsWith("."));
    graph.set(
      relative(dir, file),
      local.map((name) => relative(dir, resolve(dirname(file), name.replace(/\.js$/, ".ts")))),
    );
  }
  return graph;
}

/** The first circle found in `graph`, as the modules along it (first one repeated last), or []. */
function findCircle(graph: Map<string, string[]>): string[] {
  const done = new Set<string>();
  const path: string[] = [];
  const visit = (module: string): string[] => {
    const at = path.indexOf(module);
    if (at >= 0) return [...path.slice(at), module];
    if (done.has(module)) return [];
    path.push(module);
    for (const next of graph.get(module) ?? []) {
      const circle = visit(next);
      if (circle.length > 0) return circle;
    }
    path.pop();
    done.add(module);
    return [];
  };
  for (const module of [...graph.keys()].sort()) {
    const circle = visit(module);
    if (circle.length > 0) return circle;
  }
  return [];
}

test("the sources import one another without a circle", () => {
  const graph = importGraph(SRC);
  // Read as it must be: changes.ts imports rpc.ts for a type only.
  assert.ok(graph.get("changes.ts")?.includes("rpc.ts"), "type-only imports are in the graph");
  assert.deepEqual(findCircle(graph), []);
});

test("a circle is named along its modules", () => {
  const graph = new Map([
    ["a.ts", ["b.ts"]],
    ["b.ts", ["c.ts"]],
    ["c.ts", ["a.ts", "b.ts"]],
  ]);
  assert.deepEqual(findCircle(graph), ["a.ts", "b.ts", "c.ts", "a.ts"]);
});
