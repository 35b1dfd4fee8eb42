/**
 * A callback stream's life on this client's side (a session, a listener): its start
 * written, its first message confirmed within a bound, every later message handed on,
 * and its end heard once. Written once for both streams.
 */

import type { ClientDuplexStream, StatusObject } from "@grpc/grpc-js";
import { Confirmation } from "./async.js";
import { NoAnswer, protocolError, streamEnded } from "./errors.js";

/** What one kind of callback stream does at each step of its life. */
export interface Opening<Response, Opened> {
  /** What the start is, for the error when no confirmation comes: "opening the session". */
  readonly doing: string;
  /** The protocol error when the first message is not a confirmation. */
  readonly unconfirmed: string;
  /** Why the stream failed when it ended before its confirmation. */
  readonly endedEarly: string;
  /** What the confirmation opened; undefined when `first` is not one. */
  confirm(first: Response): Opened | undefined;
  /** Every message after the confirmation. */
  receive(message: Response): void;
  /** The stream is over, `opened` or not, with `status`: what runs on it has nowhere to answer. */
  ended(opened: boolean, status: StatusObject): void;
}

/** Write `start` on `stream`; resolves to what its confirmation opened, within `timeoutMs`. */
export function openCallbackStream<Request, Response, Opened>(
  stream: ClientDuplexStream<Request, Response>,
  start: Request,
  timeoutMs: number,
  opening: Opening<Response, Opened>,
): Promise<Opened> {
  const confirmation = new Confirmation<Opened>(timeoutMs, () => {
    stream.cancel(); // a silent sidecar keeps no stream of ours
    return new NoAnswer(opening.doing, timeoutMs);
  });
  let opened = false;
  stream.on("data", (message: Response) => {
    if (opened) {
      opening.receive(message);
      return;
    }
    if (confirmation.settled) return;
    const value = opening.confirm(message);
    if (value === undefined) {
      stream.cancel();
      confirmation.fail(protocolError(opening.unconfirmed));
    } else {
      opened = true;
      confirmation.confirm(value);
    }
  });
  stream.on("error", () => undefined); // the status below says it all
  stream.on("status", (status) => {
    opening.ended(opened, status);
    if (!opened) confirmation.fail(streamEnded(opening.endedEarly, status));
  });
  stream.write(start);
  return confirmation.promise;
}
