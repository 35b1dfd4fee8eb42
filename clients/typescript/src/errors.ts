/** SystemPromptError: every failure, with the gRPC status code and the sidecar's words. */

import { BinaryReader, WireType } from "@bufbuild/protobuf/wire";
import { Metadata, status as Code, type ServiceError } from "@grpc/grpc-js";
import { ErrorReason } from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";

export { Code };

/** A stable, machine-readable cause of a failure: a value name of the proto's ErrorReason. */
export type Reason = Exclude<keyof typeof ErrorReason, "ERROR_REASON_UNSPECIFIED">;

/** Every reason the sidecar (or this client) gives, by name: `error.reason === Reason.DUPLICATE_NAME`. */
export const Reason = Object.freeze(
  Object.fromEntries(
    Object.keys(ErrorReason)
      .filter((name) => Number.isNaN(Number(name)) && name !== "ERROR_REASON_UNSPECIFIED")
      .map((name) => [name, name]),
  ),
) as { readonly [Name in Reason]: Name };

/**
 * A failure reported by (or on the way to) the sidecar.
 *
 * `code` is the gRPC status code, `reason` the stable ErrorInfo reason
 * (e.g. "DUPLICATE_NAME"), and the message is the sidecar's own text.
 */
export class SystemPromptError extends Error {
  /** The gRPC status code. */
  readonly code: Code;
  /**
   * The stable machine-readable reason, e.g. `Reason.DUPLICATE_NAME`; `Reason.UNKNOWN`
   * when none was sent, or the plain string a newer sidecar sent.
   */
  readonly reason: Reason | (string & {});

  constructor(message: string, code: Code, reason: Reason | (string & {})) {
    super(message);
    this.name = "SystemPromptError";
    this.code = code;
    this.reason = reason;
  }
}

/** Strict interpolation failed (locally or on the sidecar). */
export class RenderError extends SystemPromptError {
  constructor(message: string) {
    super(message, Code.FAILED_PRECONDITION, Reason.RENDER_FAILED);
    this.name = "RenderError";
  }
}

/** An INVALID_ARGUMENT raised in this client, before anything is sent. */
export function invalid(message: string): SystemPromptError {
  return new SystemPromptError(message, Code.INVALID_ARGUMENT, Reason.INVALID_VALUE);
}

/** The sidecar sent what this protocol does not allow (a buggy or hostile sidecar). */
export function protocolError(message: string): SystemPromptError {
  return new SystemPromptError(`protocol error: ${message}`, Code.INTERNAL, Reason.PROTOCOL_ERROR);
}

/**
 * A stream the sidecar ended before confirming it (it is going away, or refused it):
 * its own error, or UNAVAILABLE when it ended with OK, which says nothing.
 */
export function streamEnded(message: string, status: Partial<ServiceError>): SystemPromptError {
  if (status.code === undefined || status.code === Code.OK) {
    return new SystemPromptError(`sidecar unavailable: ${message}`, Code.UNAVAILABLE, Reason.SIDECAR_UNAVAILABLE);
  }
  return errorFromGrpc(status);
}

/** The sidecar took a call and did not answer it in time: treat it as unreachable. */
export class NoAnswer extends SystemPromptError {
  constructor(what: string, timeoutMs: number) {
    super(
      `sidecar unavailable: no answer to ${what} within ${timeoutMs / 1000}s`,
      Code.UNAVAILABLE,
      Reason.SIDECAR_UNAVAILABLE,
    );
  }
}

/** The SystemPromptError for a failed call, with the ErrorInfo reason if sent. */
export function errorFromGrpc(error: Partial<ServiceError>): SystemPromptError {
  const code = error.code ?? Code.UNKNOWN;
  const message = error.details || Code[code] || String(code);
  const reason = (error.metadata === undefined ? "" : reasonOf(error.metadata)) || Reason.UNKNOWN;
  if (reason === Reason.RENDER_FAILED) return new RenderError(message);
  if (reason === Reason.UNKNOWN && code === Code.UNAVAILABLE) {
    return new SystemPromptError(`sidecar unavailable: ${message}`, code, Reason.SIDECAR_UNAVAILABLE);
  }
  return new SystemPromptError(message, code, reason);
}

/** The ErrorInfo reason in a call's trailers, or the plain `dsh-error-reason` trailer; "" for none. */
export function reasonOf(trailers: Metadata): string {
  for (const value of trailers.get(DETAILS_KEY)) {
    if (typeof value === "string") continue;
    try {
      const reason = errorInfoReason(value);
      if (reason) return reason;
    } catch {
      break; // not a google.rpc.Status: fall back to the plain trailer
    }
  }
  const [plain] = trailers.get(REASON_KEY);
  return typeof plain === "string" ? plain : "";
}

const DETAILS_KEY = "grpc-status-details-bin";
const REASON_KEY = "dsh-error-reason";
const ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo";

// google.rpc.Status {3: repeated google.protobuf.Any details}; Any {1: type_url, 2: value};
// ErrorInfo {1: reason}. Three fields are all this client reads, so it decodes them here.
function errorInfoReason(status: Uint8Array): string {
  for (const any of fields(status, 3)) {
    let typeUrl = "";
    let value: Uint8Array | undefined;
    const reader = new BinaryReader(any);
    while (reader.pos < reader.len) {
      const [number, wireType] = reader.tag();
      if (number === 1 && wireType === WireType.LengthDelimited) typeUrl = reader.string();
      else if (number === 2 && wireType === WireType.LengthDelimited) value = reader.bytes();
      else reader.skip(wireType);
    }
    if (typeUrl === ERROR_INFO_TYPE && value !== undefined) {
      const [reason] = fields(value, 1);
      return reason === undefined ? "" : new TextDecoder().decode(reason);
    }
  }
  return "";
}

function fields(message: Uint8Array, wanted: number): Uint8Array[] {
  const found: Uint8Array[] = [];
  const reader = new BinaryReader(message);
  while (reader.pos < reader.len) {
    const [number, wireType] = reader.tag();
    if (number === wanted && wireType === WireType.LengthDelimited) found.push(reader.bytes());
    else reader.skip(wireType);
  }
  return found;
}
