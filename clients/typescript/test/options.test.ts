/**
 * The README's table of options names, for each call, exactly the properties of that call's
 * options type (read with the TypeScript compiler from the sources): a new option, or one
 * gone, fails here until the table says so.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import ts from "typescript";

// From dist/test/ (where the compiled test runs) back to the package.
const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), "../..");

/** The README's table: call -> the options it lists for it. */
function tabled(): Map<string, Set<string>> {
  const readme = readFileSync(join(PACKAGE, "README.md"), "utf8");
  const table = /<!-- ts-options -->\n(.*?)\n\n/s.exec(readme);
  assert.ok(table?.[1], "the README has no <!-- ts-options --> table");
  const calls = new Map<string, Set<string>>();
  for (const row of table[1].split("\n").slice(2)) {
    const [, options = "", on = ""] = row.split("|");
    const names = (cell: string): string[] => [...cell.matchAll(/`(\w+)`/g)].map((m) => m[1] ?? "");
    for (const call of names(on.split("(")[0] ?? "")) {
      const listed = calls.get(call) ?? new Set<string>();
      for (const option of names(options)) listed.add(option);
      calls.set(call, listed);
    }
  }
  return calls;
}

/** Each public call's options: the properties of its `options` parameter's type. */
function declared(): Map<string, Set<string>> {
  const config = ts.getParsedCommandLineOfConfigFile(join(PACKAGE, "tsconfig.json"), {}, {
    ...ts.sys,
    onUnRecoverableConfigFileDiagnostic: (diagnostic) => assert.fail(String(diagnostic.messageText)),
  });
  assert.ok(config);
  const program = ts.createProgram([join(PACKAGE, "src", "index.ts")], config.options);
  const checker = program.getTypeChecker();
  const calls = new Map<string, Set<string>>();
  const add = (name: string, parameters: readonly ts.ParameterDeclaration[]): void => {
    const options = parameters.find((p) => p.name.getText() === "options");
    if (options === undefined) return;
    const type = checker.getNonNullableType(checker.getTypeAtLocation(options));
    const listed = calls.get(name) ?? new Set<string>();
    for (const property of checker.getPropertiesOfType(type)) listed.add(property.name);
    calls.set(name, listed);
  };
  for (const file of ["client.ts", "registrar.ts"]) {
    const source = program.getSourceFile(join(PACKAGE, "src", file));
    assert.ok(source, file);
    ts.forEachChild(source, function visit(node): void {
      if (ts.isFunctionDeclaration(node) && node.name?.text === "connect") add("connect", node.parameters);
      if (ts.isClassDeclaration(node) && ["Client", "Registrar"].includes(node.name?.text ?? "")) {
        for (const member of node.members) {
          const modifiers = ts.canHaveModifiers(member) ? (ts.getModifiers(member) ?? []) : [];
          const hidden = modifiers.some((m) => m.kind === ts.SyntaxKind.PrivateKeyword);
          if (ts.isMethodDeclaration(member) && ts.isIdentifier(member.name) && !hidden) {
            add(member.name.text, member.parameters);
          }
        }
      }
    });
  }
  return calls;
}

test("the README's options table lists every option of every call, and no other", () => {
  const inCode = declared();
  assert.ok(inCode.size >= 12, `found the options of only ${[...inCode.keys()].join(", ")}`);
  const sorted = (calls: Map<string, Set<string>>): Record<string, string[]> =>
    Object.fromEntries([...calls].sort(([a], [b]) => a.localeCompare(b)).map(([k, v]) => [k, [...v].sort()]));
  assert.deepEqual(sorted(tabled()), sorted(inCode));
});
