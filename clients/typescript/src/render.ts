/**
 * Strict {{variable}} interpolation: pure functions with the same rules and the
 * same error messages as the Python client's and the sidecar's renderer.
 */

import { RenderError } from "./errors.js";

/** The line that opens every non-empty runtime-context snapshot. */
export const CONTEXT_SNAPSHOT_HEADER =
  "Current runtime context. This snapshot supersedes earlier runtime-context snapshots.";

/** A section or context: anything with a name and a text. */
export interface NamedText {
  readonly name: string;
  readonly text: string;
}

/** What rendering reads from an assembly. */
export interface Renderable {
  readonly sections: readonly NamedText[];
  readonly contexts: readonly NamedText[];
  readonly variables: Readonly<Record<string, string | undefined | null>>;
}

/**
 * Interpolate every section, drop the empty ones, join with one blank line.
 * @throws {RenderError} on an unknown, valueless or malformed reference.
 */
export function renderPrompt(assembly: Pick<Renderable, "sections" | "variables">): string {
  return renderParts(assembly.sections, assembly.variables, "section");
}

/**
 * The runtime-context snapshot, or "" when no context text is left.
 * @throws {RenderError} on an unknown, valueless or malformed reference.
 */
export function renderContextSnapshot(assembly: Pick<Renderable, "contexts" | "variables">): string {
  const body = renderParts(assembly.contexts, assembly.variables, "context");
  return body ? `${CONTEXT_SNAPSHOT_HEADER}\n\n${body}` : "";
}

/** Replace every {{name}} in `text`; `where` names the part for errors. */
export function interpolate(
  text: string,
  variables: Readonly<Record<string, string | undefined | null>>,
  where: string,
): string {
  if (!text.includes("{{")) return text;
  let out = "";
  let position = 0;
  for (;;) {
    const start = text.indexOf("{{", position);
    if (start < 0) break;
    GROUP.lastIndex = start;
    const group = GROUP.exec(text);
    if (group === null) {
      const end = text.indexOf("}}", start + 2);
      if (end < 0) break; // a lone "{{" with no "}}" after it stays literal
      throw new RenderError(
        `malformed prompt variable reference at "${snippet(text, start, end)}" in ${where}`,
      );
    }
    const [reference, name = ""] = group;
    out += text.slice(position, start) + resolve(reference, name, variables, where);
    position = start + reference.length;
  }
  return out + text.slice(position);
}

const NAME = /^[a-z][a-z0-9_]*$/;
// A complete group at the current position: "{{", no braces, "}}".
const GROUP = /\{\{([^{}]*)\}\}/y;
const SNIPPET_LIMIT = 40;

function resolve(
  reference: string,
  name: string,
  variables: Readonly<Record<string, string | undefined | null>>,
  where: string,
): string {
  if (!NAME.test(name)) {
    throw new RenderError(`malformed prompt variable reference "${reference}" in ${where}`);
  }
  if (!Object.hasOwn(variables, name)) {
    const registered = Object.keys(variables).join(", ") || "(none)";
    throw new RenderError(
      `unknown prompt variable "${reference}" in ${where}; registered variables: ${registered}`,
    );
  }
  const value = variables[name];
  if (value === undefined || value === null) {
    throw new RenderError(
      `prompt variable "${reference}" has no value for this assembly (${where})`,
    );
  }
  return value;
}

function renderParts(
  parts: readonly NamedText[],
  variables: Readonly<Record<string, string | undefined | null>>,
  noun: string,
): string {
  return parts
    .map((part) => interpolate(part.text, variables, `${noun} "${part.name}"`))
    .filter((text) => text !== "")
    .join("\n\n");
}

// From the "{{" through the run of closing braces that follows it, in code points.
function snippet(text: string, start: number, end: number): string {
  let stop = end + 2;
  while (stop < text.length && text[stop] === "}") stop += 1;
  const points = Array.from(text.slice(start, stop));
  return points.length > SNIPPET_LIMIT ? points.slice(0, SNIPPET_LIMIT).join("") + "…" : points.join("");
}
