/** renderPrompt and renderContextSnapshot: pure, strict, the Python renderer's messages. */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as dsp from "../src/index.js";

function assembly(text: string, variables: Record<string, string | undefined> = {}): dsp.PromptAssembly {
  return { sections: [{ name: "s", text }], contexts: [], tools: [], variables };
}

function renderFails(text: string, variables: Record<string, string | undefined>, message: string): void {
  assert.throws(() => dsp.renderPrompt(assembly(text, variables)), (error: unknown) => {
    assert.ok(error instanceof dsp.RenderError);
    assert.equal(error.code, dsp.Code.FAILED_PRECONDITION);
    assert.equal(error.reason, dsp.Reason.RENDER_FAILED);
    assert.equal(error.message, message);
    return true;
  });
}

test("sections are interpolated, empty ones dropped, the rest joined by a blank line", () => {
  const rendered = dsp.renderPrompt({
    sections: [
      { name: "a", text: "Model {{model}}." },
      { name: "empty", text: "" },
      { name: "b", text: "Plain." },
    ],
    variables: { model: "m" },
  });
  assert.equal(rendered, "Model m.\n\nPlain.");
});

test("the context snapshot has its header, or is empty when nothing is left", () => {
  const contexts = [{ name: "c", text: "In {{cwd}}." }];
  assert.equal(
    dsp.renderContextSnapshot({ contexts, variables: { cwd: "/w" } }),
    `${dsp.CONTEXT_SNAPSHOT_HEADER}\n\nIn /w.`,
  );
  assert.equal(dsp.renderContextSnapshot({ contexts: [{ name: "c", text: "" }], variables: {} }), "");
});

test("an unknown variable fails, naming the registered ones", () => {
  renderFails("{{modle}}", { model: "m" }, 'unknown prompt variable "{{modle}}" in section "s"; registered variables: model');
  renderFails("{{x}}", {}, 'unknown prompt variable "{{x}}" in section "s"; registered variables: (none)');
});

test("prototype names are unknown unless registered", () => {
  renderFails("{{constructor}}", {}, 'unknown prompt variable "{{constructor}}" in section "s"; registered variables: (none)');
  assert.equal(dsp.renderPrompt(assembly("{{constructor}}", { constructor: "c" })), "c");
});

test("a variable without a value for this assembly fails", () => {
  renderFails("{{cwd}}", { cwd: undefined }, 'prompt variable "{{cwd}}" has no value for this assembly (section "s")');
});

test("a complete group with a malformed name fails", () => {
  renderFails("{{ model }}", { model: "m" }, 'malformed prompt variable reference "{{ model }}" in section "s"');
  renderFails("{{}}", {}, 'malformed prompt variable reference "{{}}" in section "s"');
});

test("an opening that closes no group fails while a }} follows, else stays literal", () => {
  renderFails("{{{model}}}", { model: "m" }, 'malformed prompt variable reference at "{{{model}}}" in section "s"');
  assert.equal(dsp.renderPrompt(assembly("a {{ b", {})), "a {{ b");
});

test("a long malformed opening is cut to forty characters", () => {
  const text = "{{" + "{".repeat(50) + "}}";
  renderFails(text, {}, `malformed prompt variable reference at "${text.slice(0, 40)}…" in section "s"`);
});

test("substituted values are never scanned again", () => {
  assert.equal(dsp.renderPrompt(assembly("{{a}}", { a: "{{b}}" })), "{{b}}");
});

test("errors in contexts name the context", () => {
  assert.throws(
    () => dsp.renderContextSnapshot({ contexts: [{ name: "mode", text: "{{m}}" }], variables: {} }),
    { message: 'unknown prompt variable "{{m}}" in context "mode"; registered variables: (none)' },
  );
});
