/**
 * A listener stream's parts by slot (docs/protocol.md, "Part slots" and "Tool slots").
 *
 * The sidecar and this client both hold the stream's base, the parts of the previous
 * invocation: an invocation names its unchanged parts by their place there, and a reply
 * names the parts the listener left untouched by their place in its invocation. Parts
 * are held as their wire values, so an unchanged part is neither decoded nor encoded
 * again; the listener sees ordinary objects made from them.
 */

import { create } from "@bufbuild/protobuf";
import * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { assemblyToProto } from "./convert.js";
import { protocolError } from "./errors.js";
import { ToolSchema, type AssembledSection, type PromptAssembly, type ToolSchemaLike } from "./types.js";

type Text = readonly [name: string, text: string];
type Tool = readonly [name: string, description: string, parametersJson: string];
type Item = readonly [name: string, value: string | undefined];

/** What replies name by slot: every part (`part-slots`), the tools alone (`tool-slots`), or nothing. */
export type Slotted = "parts" | "tools" | undefined;

/** The slot fields of a reply (ListenerNext, ListenerResult). */
export interface ReplySlots {
  slots?: pb.PartSlots;
  toolSlots?: number[];
}

/** An assembly's parts as the sidecar holds them. */
export class Parts {
  constructor(
    readonly sections: readonly Text[],
    readonly contexts: readonly Text[],
    readonly tools: readonly Tool[],
    readonly variables: readonly Item[],
  ) {}

  /**
   * An invocation's parts: `slots` against `base` (the stream's; undefined before the
   * first), the rest from `message`. Slots that cannot be right throw PROTOCOL_ERROR.
   */
  static received(message: pb.PromptAssembly | undefined, slots: pb.PartSlots | undefined, base: Parts | undefined): Parts {
    const where = "an invocation";
    return new Parts(
      resolve(slots?.sections, message?.sections, base?.sections, text, "section", where)[0],
      resolve(slots?.contexts, message?.contexts, base?.contexts, text, "context", where)[0],
      resolve(slots?.tools, message?.tools, base?.tools, tool, "tool", where)[0],
      resolve(slots?.variables, message?.variables, base?.variables, item, "variable", where)[0],
    );
  }
}

/** One invocation's parts: the assemblies a listener is handed, and its replies by slot. */
export class Invocation {
  readonly #parts: Parts;
  readonly #slotted: Slotted;
  /** Every section, context and tool object handed to the listener, and its slot in the invocation. */
  readonly #handed = new Map<object, number>();
  readonly #variables: Map<string, number>;

  constructor(parts: Parts, slotted: Slotted) {
    this.#parts = parts;
    this.#slotted = slotted;
    this.#variables = new Map(parts.variables.map(([name], slot) => [name, slot]));
  }

  /** The invocation's assembly, as ordinary objects. */
  view(): PromptAssembly {
    const all = (parts: readonly unknown[]) => parts.map((_, slot) => slot);
    const { sections, contexts, tools, variables } = this.#parts;
    return this.#made(sections, contexts, tools, variables, [all(sections), all(contexts), all(tools)]);
  }

  /**
   * What next() returned, its slots read against this invocation whether asked for or
   * not (an older sidecar always sent tool slots). Bad slots throw PROTOCOL_ERROR.
   */
  decode(message: pb.PromptAssembly | undefined, slots: pb.PartSlots | undefined, toolSlots: readonly number[]): PromptAssembly {
    if (slots?.tools.length && toolSlots.length) {
      throw protocolError("next() came back with both tool_slots and slots.tools");
    }
    const parts = this.#parts;
    const where = "next()";
    const [sections, sectionSlots] = resolve(slots?.sections, message?.sections, parts.sections, text, "section", where);
    const [contexts, contextSlots] = resolve(slots?.contexts, message?.contexts, parts.contexts, text, "context", where);
    const tools = slots?.tools.length ? slots.tools : toolSlots;
    const [toolParts, placed] = resolve(tools, message?.tools, parts.tools, tool, "tool", where);
    const [variables] = resolve(slots?.variables, message?.variables, parts.variables, item, "variable", where);
    return this.#made(sections, contexts, toolParts, variables, [sectionSlots, contextSlots, placed]);
  }

  /** `assembly` as a message, and the slot fields of the reply that carries it. */
  encode(assembly: PromptAssembly): [pb.PromptAssembly, ReplySlots] {
    if (assembly === null || typeof assembly !== "object" || !Array.isArray(assembly.tools)) {
      throw new TypeError(`a listener must return a PromptAssembly, not ${String(assembly)}`);
    }
    if (this.#slotted === undefined) return [assemblyToProto(assembly), {}];
    const held = this.#parts;
    const [toolSlots, tools] = this.#slots(assembly.tools, held.tools.length, (part, slot) => untouchedTool(part, held.tools[slot]));
    if (this.#slotted === "tools") return [assemblyToProto({ ...assembly, tools }), { toolSlots }];
    const same = (held: readonly Text[]) => (part: AssembledSection, slot: number) => sameText(part, held[slot]);
    const [sectionSlots, sections] = this.#slots(assembly.sections, held.sections.length, same(held.sections));
    const [contextSlots, contexts] = this.#slots(assembly.contexts ?? [], held.contexts.length, same(held.contexts));
    const variableSlots: number[] = [];
    const variables: Record<string, string | undefined> = {};
    for (const [name, value] of Object.entries(assembly.variables ?? {})) {
      const slot = this.#variables.get(name);
      const held = slot === undefined ? undefined : this.#parts.variables[slot];
      const unchanged = slot !== undefined && held !== undefined && held[1] === (value ?? undefined);
      variableSlots.push(unchanged ? slot : -1);
      if (!unchanged) variables[name] = value;
    }
    const message = assemblyToProto({ sections, contexts, tools, variables });
    const slots = create(pb.PartSlotsSchema, {
      sections: sectionSlots,
      contexts: contextSlots,
      tools: toolSlots,
      variables: variableSlots,
    });
    return [message, { slots }];
  }

  /**
   * Each part's slot when it is an object handed out for it and still unchanged, else -1; and
   * the others. At most `held` are named (the limit in docs/protocol.md, "Part slots": the
   * sidecar refuses a longer list), so a part repeated past that goes in full.
   */
  #slots<T extends object>(parts: readonly T[], held: number, unchanged: (part: T, slot: number) => boolean): [number[], T[]] {
    let named = 0;
    const slots = parts.map((part) => {
      const slot = part !== null && typeof part === "object" && named < held ? this.#handed.get(part) : undefined;
      if (slot === undefined || !unchanged(part, slot)) return -1;
      named++;
      return slot;
    });
    return [slots, parts.filter((_, i) => slots[i] === -1)];
  }

  #made(
    sections: readonly Text[],
    contexts: readonly Text[],
    tools: readonly Tool[],
    variables: readonly Item[],
    placed: readonly (readonly number[])[],
  ): PromptAssembly {
    const hand = <T extends object>(made: T[], slots: readonly number[] | undefined): T[] => {
      made.forEach((part, i) => {
        const slot = slots?.[i] ?? -1;
        if (slot >= 0) this.#handed.set(part, slot);
      });
      return made;
    };
    const record: Record<string, string | undefined> = {};
    for (const [name, value] of variables) record[name] = value;
    return {
      sections: hand(sections.map(([name, text]) => ({ name, text })), placed[0]),
      contexts: hand(contexts.map(([name, text]) => ({ name, text })), placed[1]),
      tools: hand(tools.map((held) => ToolSchema.fromJson(...held)), placed[2]) as ToolSchemaLike[],
      variables: record,
    };
  }
}

function sameText(part: AssembledSection, held: Text | undefined): boolean {
  return held !== undefined && part.name === held[0] && part.text === held[1];
}

function untouchedTool(part: ToolSchemaLike, held: Tool | undefined): boolean {
  return (
    held !== undefined &&
    part instanceof ToolSchema &&
    part.parametersJson() === held[2] &&
    part.name === held[0] &&
    part.description === held[1]
  );
}

function text(message: pb.AssembledSection | pb.AssembledContext): Text {
  return [message.name, message.text];
}

function tool(message: pb.ToolSchema): Tool {
  return [message.name, message.description, message.parametersJson];
}

function item(message: pb.Variable): Item {
  return [message.name, message.value];
}

const NO_SLOTS: readonly number[] = [];

/**
 * One kind's parts from `slots` into `held`, or -1 for the next of `fresh`; and each
 * one's slot (all -1 when no slots came: every part was sent).
 */
function resolve<M, H>(
  slots: readonly number[] | undefined,
  fresh: readonly M[] | undefined,
  held: readonly H[] | undefined,
  convert: (message: M) => H,
  noun: string,
  where: string,
): [H[], readonly number[]] {
  const messages = fresh ?? [];
  if (!slots?.length) return [messages.map(convert), messages.length ? messages.map(() => -1) : NO_SLOTS];
  const have = held ?? [];
  let next = 0;
  const parts = slots.map((slot, index) => {
    if (!(Number.isInteger(slot) && slot >= -1 && slot < have.length)) {
      throw protocolError(`${where} came with ${noun} slot ${slot}, but ${have.length} ${noun}s were held`);
    }
    if (index === have.length + messages.length) {
      // as the sidecar bounds replies (docs/protocol.md, "Part slots")
      throw protocolError(
        `${where} came with ${slots.length} ${noun} slots, more than the ${have.length} ${noun}s held and ${messages.length} sent`,
      );
    }
    if (slot >= 0) return have[slot] as H;
    const message = messages[next++];
    if (message === undefined) throw protocolError(`${where} came with more -1 ${noun} slots than new ${noun}s`);
    return convert(message);
  });
  if (next !== messages.length) throw protocolError(`${where} came with more new ${noun}s than -1 ${noun} slots`);
  return [parts, slots];
}
