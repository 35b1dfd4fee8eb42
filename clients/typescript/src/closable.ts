/**
 * What the connection closes with it: its open change and prompt streams. Apart from
 * connection.ts, which the local cache's change stream would otherwise import back.
 */

/** A stream the connection closes when the client closes. */
export interface Closable {
  close(): void;
}
