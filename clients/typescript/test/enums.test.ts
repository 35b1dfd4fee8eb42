/**
 * Every proto enum the API exposes has its names by constant (`ChangeKind.SECTION` is "section"
 * for CHANGE_KIND_SECTION, `PrefixLayout.TOOLS_FIRST` "tools-first" for PREFIX_LAYOUT_TOOLS_FIRST),
 * one per value besides UNSPECIFIED, and the client converts each value to its name and back: a
 * value added to the proto fails here until it has one.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import type { DescEnum } from "@bufbuild/protobuf";
import { CHANGE_ACTIONS, CHANGE_KINDS, LAYOUTS, PART_KINDS, SOURCE_KINDS, TOOL_FREEZES } from "../src/convert.js";
import * as pb from "../src/gen/dsh/systemprompt/v1/system_prompt_pb.js";
import * as dsp from "../src/index.js";
import { FAILURE_POLICIES } from "../src/registrar.js";

interface Exposed {
  schema: DescEnum;
  constants: Readonly<Record<string, string>>;
  /** The client's name for each number it reads, when it reads the enum. */
  read?: Record<number, string>;
  /** The number the client sends for each name, when it sends the enum. */
  sent?: Record<string, number>;
  /** An UNKNOWN constant names a newer sidecar's value. */
  unknown: boolean;
}

const EXPOSED: Exposed[] = [
  { schema: pb.ChangeKindSchema, constants: dsp.ChangeKind, read: CHANGE_KINDS, unknown: true },
  { schema: pb.ChangeActionSchema, constants: dsp.ChangeAction, read: CHANGE_ACTIONS, unknown: true },
  { schema: pb.PartKindSchema, constants: dsp.PartKind, read: PART_KINDS, unknown: true },
  { schema: pb.SourceKindSchema, constants: dsp.SourceKind, read: SOURCE_KINDS, unknown: true },
  { schema: pb.PrefixLayoutSchema, constants: dsp.PrefixLayout, read: LAYOUTS, unknown: false },
  { schema: pb.FailurePolicySchema, constants: dsp.FailurePolicy, sent: FAILURE_POLICIES, unknown: false },
  { schema: pb.ToolFreezeSchema, constants: dsp.ToolFreeze, sent: TOOL_FREEZES, unknown: false },
];

for (const enumeration of EXPOSED) {
  test(`${enumeration.schema.name} has a constant per value of the proto's enum`, () => {
    const expected: Record<string, string> = {};
    for (const value of enumeration.schema.values) {
      if (value.number === 0) continue; // UNSPECIFIED: the wire's "not set", never a client's value
      const spelt = value.localName.toLowerCase().replaceAll("_", "-");
      expected[value.localName] = spelt;
      if (enumeration.read) assert.equal(enumeration.read[value.number], spelt, `reading ${value.name}`);
      if (enumeration.sent) assert.equal(enumeration.sent[spelt], value.number, `sending ${value.name}`);
    }
    if (enumeration.unknown) expected["UNKNOWN"] = "unknown";
    assert.deepEqual({ ...enumeration.constants }, expected);
    if (enumeration.read) assert.equal(Object.keys(enumeration.read).length, enumeration.schema.values.length - 1);
  });
}
