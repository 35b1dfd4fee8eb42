/** Listings of the registry (ListRegistrations) and the filters that watches share. */

import { create } from "@bufbuild/protobuf";
import type { ServiceError } from "@grpc/grpc-js";
import * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { CHANGE_KINDS, toolsetFromProto } from "./convert.js";
import { errorFromGrpc, invalid } from "./errors.js";
import { ruleFromProto } from "./rules.js";
import type { Rpc } from "./rpc.js";
import type { ChangeKind, RegistrationInfo, Snapshot } from "./types.js";

/** Which registrations a watch or a listing is about. */
export interface FilterOptions {
  /** Only this scope's layer (scope handles: on this key); default: every layer. */
  scope?: string | undefined;
  /** With a scope: also its ancestors' layers and the global layer. */
  ancestors?: boolean | undefined;
  /** Only these kinds; default: every kind. */
  kinds?: readonly ChangeKind[] | undefined;
}

/** The wire filter; an unknown kind is refused here. */
export function changeFilter(options: FilterOptions): pb.ChangeFilter {
  const wire = new Map(Object.entries(CHANGE_KINDS).map(([number, kind]) => [kind, Number(number)]));
  const kinds = (options.kinds ?? []).map((kind) => {
    const number = wire.get(kind);
    if (number === undefined) throw invalid(`unknown kind "${String(kind)}"; one of ${[...wire.keys()].join(", ")}`);
    return number;
  });
  return create(pb.ChangeFilterSchema, { scope: options.scope ?? "", ancestors: options.ancestors ?? false, kinds });
}

/** Read a whole listing (every batch) into one Snapshot, within `timeoutMs`. */
export async function listRegistrations(
  rpc: Rpc,
  request: pb.ListRegistrationsRequest,
  timeoutMs?: number,
): Promise<Snapshot> {
  const deadline = timeoutMs === undefined ? undefined : new Date(Date.now() + timeoutMs);
  const snapshot: Snapshot = { revision: 0, incarnation: "", registrations: [] };
  try {
    for await (const batch of rpc.serverStream(pb.SystemPromptService.method.listRegistrations, request, deadline)) {
      const message = batch as pb.ListRegistrationsResponse;
      snapshot.revision = Number(message.revision);
      snapshot.incarnation = message.incarnation;
      snapshot.registrations.push(...message.registrations.map(registrationFromProto));
    }
  } catch (error) {
    throw errorFromGrpc(error as ServiceError);
  }
  return snapshot;
}

export function registrationFromProto(message: pb.RegistrationInfo): RegistrationInfo {
  const value = message.value?.value;
  return {
    ref: message.ref,
    kind: CHANGE_KINDS[message.kind] ?? "unknown",
    name: message.name,
    scope: message.scope || undefined,
    order: message.order,
    complete: message.complete,
    dynamic: message.dynamic,
    owner: message.owner,
    ownerLabel: message.ownerLabel,
    sizeBytes: Number(message.sizeBytes),
    fingerprint: message.fingerprint,
    hasValue: value?.case !== undefined,
    value: listedValue(message.value),
    global: message.global,
  };
}

/** A listed static value: a text, a tool list or a rule (undefined for "no value"). */
function listedValue(message: pb.RegisteredValue | undefined): RegistrationInfo["value"] {
  const value = message?.value;
  if (value?.case === "text") return value.value;
  if (value?.case === "tools") return toolsetFromProto(value.value);
  if (value?.case === "rule") return ruleFromProto(value.value);
  return undefined;
}
