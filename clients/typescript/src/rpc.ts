/**
 * The gRPC transport: @grpc/grpc-js calls whose messages are the protobuf-es
 * types generated from the proto, (de)serialized with their descriptors.
 */

import { readFileSync } from "node:fs";
import { fromBinary, toBinary, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";

/** A method of the generated service descriptor, with its request and response types. */
export interface Method<I extends DescMessage, O extends DescMessage> {
  readonly name: string;
  readonly parent: { readonly typeName: string };
  readonly input: I;
  readonly output: O;
}

/**
 * TLS to the sidecar: its CA, and a client certificate for mutual TLS.
 * Each may be given as PEM bytes or text, or as `{path}` to read a file.
 */
export interface TlsOptions {
  /** The CA that signed the sidecar's certificate; default: the system's roots. */
  rootCertificates?: Pem | undefined;
  /** The client's private key, for mutual TLS. */
  privateKey?: Pem | undefined;
  /** The client's certificate chain, for mutual TLS. */
  certificateChain?: Pem | undefined;
  /** The name to check the sidecar's certificate against, when the address names another host. */
  serverName?: string | undefined;
}

/** PEM data, or a file to read it from. */
export type Pem = string | Uint8Array | { path: string };

/** Options of the channel: what `connect()` passes through. */
export interface ChannelSettings {
  tls?: TlsOptions | boolean | undefined;
  /** grpc-js interceptors for every call (for example to trace or count messages). */
  interceptors?: grpc.Interceptor[] | undefined;
}

const CHANNEL_OPTIONS: grpc.ChannelOptions = {
  // Notice a vanished sidecar within ~15 s even when no call is active.
  "grpc.keepalive_time_ms": 10_000,
  "grpc.keepalive_timeout_ms": 5_000,
  "grpc.keepalive_permit_without_calls": 1,
  "grpc.http2.max_pings_without_data": 0,
  // Reconnect quickly after a sidecar restart instead of backing off for minutes.
  "grpc.initial_reconnect_backoff_ms": 100,
  "grpc.max_reconnect_backoff_ms": 2_000,
  "grpc.max_receive_message_length": 64 * 1024 * 1024,
  // A connection of its own, closed with the client: grpc-js would share one among a
  // process's clients (and keep it after close), and over loopback without credentials
  // the sidecar counts sessions per connection (limits.max_sessions_per_peer).
  "grpc.use_local_subchannel_pool": 1,
};

/** A grpc-js client for `address` (HOST:PORT or unix:PATH). */
export function openChannel(address: string, settings: ChannelSettings): grpc.Client {
  const options: grpc.ClientOptions = { ...CHANNEL_OPTIONS };
  if (settings.interceptors) options.interceptors = settings.interceptors;
  const tls = settings.tls === true ? {} : settings.tls || undefined;
  if (tls === undefined) return new grpc.Client(address, grpc.credentials.createInsecure(), options);
  if (tls.serverName) {
    options["grpc.ssl_target_name_override"] = tls.serverName;
    options["grpc.default_authority"] = tls.serverName;
  }
  const credentials = grpc.credentials.createSsl(
    pem(tls.rootCertificates),
    pem(tls.privateKey),
    pem(tls.certificateChain),
  );
  return new grpc.Client(address, credentials, options);
}

function pem(value: Pem | undefined): Buffer | null {
  if (value === undefined) return null;
  if (typeof value === "string") return Buffer.from(value);
  if (value instanceof Uint8Array) return Buffer.from(value);
  return readFileSync(value.path);
}

/** Typed calls over one grpc-js client; every call carries the same metadata. */
export class Rpc {
  readonly #client: grpc.Client;
  readonly #token: string | undefined;

  constructor(client: grpc.Client, token: string | undefined) {
    this.#client = client;
    this.#token = token;
  }

  /** What every call and stream carries: the bearer token, when there is one. */
  metadata(): grpc.Metadata {
    const metadata = new grpc.Metadata();
    if (this.#token) metadata.set("authorization", `Bearer ${this.#token}`);
    return metadata;
  }

  unary<I extends DescMessage, O extends DescMessage>(
    method: Method<I, O>,
    request: MessageShape<I>,
    deadline?: Date,
    signal?: AbortSignal,
  ): Promise<MessageShape<O>> {
    return new Promise((resolve, reject) => {
      const onAbort = (): void => call.cancel();
      const call = this.#client.makeUnaryRequest(
        path(method),
        serializer(method.input),
        deserializer(method.output),
        request,
        this.metadata(),
        deadline === undefined ? {} : { deadline },
        (error, response) => {
          // A signal reused over many calls must not keep one listener per finished call.
          signal?.removeEventListener("abort", onAbort);
          if (error || response === undefined) reject(error);
          else resolve(response);
        },
      );
      if (signal === undefined) return;
      if (signal.aborted) call.cancel();
      else signal.addEventListener("abort", onAbort, { once: true });
    });
  }

  bidi<I extends DescMessage, O extends DescMessage>(
    method: Method<I, O>,
  ): grpc.ClientDuplexStream<MessageShape<I>, MessageShape<O>> {
    return this.#client.makeBidiStreamRequest(
      path(method),
      serializer(method.input),
      deserializer(method.output),
      this.metadata(),
    );
  }

  serverStream<I extends DescMessage, O extends DescMessage>(
    method: Method<I, O>,
    request: MessageShape<I>,
    deadline?: Date,
  ): grpc.ClientReadableStream<MessageShape<O>> {
    return this.#client.makeServerStreamRequest(
      path(method),
      serializer(method.input),
      deserializer(method.output),
      request,
      this.metadata(),
      deadline === undefined ? {} : { deadline },
    );
  }

  /** Resolves once the channel is connected, or rejects at `deadline`. */
  waitForReady(deadline: Date): Promise<void> {
    return new Promise((resolve, reject) =>
      this.#client.waitForReady(deadline, (error) => (error ? reject(error) : resolve())),
    );
  }

  close(): void {
    this.#client.close();
  }
}

function path(method: Method<DescMessage, DescMessage>): string {
  return `/${method.parent.typeName}/${method.name}`;
}

function serializer<I extends DescMessage>(schema: I): (message: MessageShape<I>) => Buffer {
  return (message) => {
    const bytes = toBinary(schema, message);
    return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  };
}

function deserializer<O extends DescMessage>(schema: O): (bytes: Buffer) => MessageShape<O> {
  return (bytes) => fromBinary(schema, bytes);
}
