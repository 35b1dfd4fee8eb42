/** What the tests share: the built-in sections, and small readers of assemblies. */

import type { PromptAssembly } from "../src/index.js";

export const IDENTITY = "You are an AI agent powered by DeepSeek Harness.";
export const BUILTIN_SECTIONS = ["harness:identity", "deployment:persona"];

/** The sections' names, in prompt order. */
export function sectionNames(assembly: PromptAssembly): string[] {
  return assembly.sections.map((section) => section.name);
}

/** The sections' names without the sidecar's built-ins. */
export function ownSections(assembly: PromptAssembly): string[] {
  return sectionNames(assembly).filter((name) => !BUILTIN_SECTIONS.includes(name));
}

/** The tools' names, in model order. */
export function toolNames(assembly: PromptAssembly): string[] {
  return assembly.tools.map((tool) => tool.name);
}
