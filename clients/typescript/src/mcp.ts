/**
 * The MCP tools bridge: an MCP server's tools as one tools registration, kept current. Its own
 * entry point, `@dsh/system-prompt/mcp`, imports `@modelcontextprotocol/sdk`; the client's main
 * entry never does, and the SDK is not one of its dependencies.
 *
 * ```ts
 * import { McpTools } from "@dsh/system-prompt/mcp";
 * const bridge = new McpTools(client, "fs");   // or a Scope
 * await mcpClient.connect(transport);
 * await bridge.attach(mcpClient);              // again after each reconnect
 * await bridge.dispose();                      // the registration and the instructions
 * ```
 *
 * The agent keeps its MCP connection and the `tools/call` path; the sidecar only needs the
 * schemas. The tools are one registration labelled `mcp:<server>`, named
 * `mcp__<server>__<tool>`, sorted by name, each schema serialised canonically (sorted keys, no
 * whitespace), so a reconnect, a protocol version or a server sending its keys in another order
 * never changes the bytes and never sends an update. `notifications/tools/list_changed`
 * re-lists and, when the bytes differ, updates the registration in place (one `updated` event);
 * `attach()` after a reconnect re-lists the same way. The server's instructions are the value of
 * the variable `mcp_<server>_instructions` and the section `mcp:<server>` is
 * `{{mcp_<server>_instructions}}`: a variable's value is never scanned for `{{ }}` again, so
 * instructions holding `{{x}}` render as written.
 */

import type { Client as McpClient } from "@modelcontextprotocol/sdk/client/index.js";
import { ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

import type { Client, Scope } from "./client.js";
import type { Handle } from "./registrar.js";
import { ToolSchema } from "./types.js";

/** A server answering with a cursor forever would keep the bridge listing forever. */
export const MAX_PAGES = 100;
export const DEFAULT_INSTRUCTIONS_ORDER = 50;

/** What the bridge uses of the SDK's `Client`. */
export type McpSession = Pick<McpClient, "listTools" | "getInstructions" | "setNotificationHandler">;

/** JSON with sorted keys and no whitespace: the same text for the same value, whatever order
 * the server sent its keys in. */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map((item) => canonicalJson(item ?? null)).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const object = value as Record<string, unknown>;
    const members = Object.keys(object)
      .filter((key) => object[key] !== undefined)
      .sort()
      .map((key) => `${JSON.stringify(key)}:${canonicalJson(object[key])}`);
    return `{${members.join(",")}}`;
  }
  return JSON.stringify(value);
}

/** The instructions' variable: `mcp_<server>_instructions`, in a variable name's alphabet. */
export function variableName(server: string): string {
  return `mcp_${server.toLowerCase().replace(/[^a-z0-9_]/g, "_")}_instructions`;
}

export interface McpToolsOptions {
  /** The instructions section's order (default 50). */
  instructionsOrder?: number | undefined;
}

/** One MCP server's tools and instructions, registered through a client or a scope and kept
 * current; see the module's comment. */
export class McpTools {
  readonly server: string;
  readonly label: string;
  readonly variable: string;
  /** Listings done, counted so a test can see one happened. */
  listings = 0;
  /** The error of the last background re-listing, if it failed. */
  lastError: unknown = undefined;
  readonly #registrar: Client | Scope;
  readonly #order: number;
  #session: McpSession | undefined;
  #tools: Handle | undefined;
  #instructions: Handle | undefined;
  #section: Handle | undefined;
  #listed: ToolSchema[] = [];
  #wire: string | undefined;
  #instructionsText: string | undefined;
  #queue: Promise<unknown> = Promise.resolve();
  #following: Promise<void> | undefined;
  #dirty = false;

  constructor(registrar: Client | Scope, server: string, options: McpToolsOptions = {}) {
    if (server === "") throw new Error("an MCP server's name must be non-empty");
    this.server = server;
    this.label = `mcp:${server}`;
    this.variable = variableName(server);
    this.#registrar = registrar;
    this.#order = options.instructionsOrder ?? DEFAULT_INSTRUCTIONS_ORDER;
  }

  /** The tools as registered, in the registration's order. */
  get tools(): ToolSchema[] {
    return [...this.#listed];
  }

  /** The sidecar's name of the server's tool `tool`. */
  toolName(tool: string): string {
    return `mcp__${this.server}__${tool}`;
  }

  /** The server's name of a sidecar tool name, or undefined when it is not this server's. */
  serverTool(name: string): string | undefined {
    const prefix = `mcp__${this.server}__`;
    return name.startsWith(prefix) ? name.slice(prefix.length) : undefined;
  }

  /**
   * Follow `session` (a connected SDK `Client`): list its tools and register them (the first
   * time) or update them (after a reconnect, only when the bytes differ); the same for
   * `instructions`, by default the server's (`getInstructions()`). Installs the session's
   * `notifications/tools/list_changed` handler (replacing any other).
   */
  async attach(session: McpSession, instructions?: string): Promise<void> {
    const first = this.#tools === undefined;
    this.#session = session;
    session.setNotificationHandler(ToolListChangedNotificationSchema, () => {
      if (this.#session === session) this.#schedule();
    });
    try {
      await this.#serialised(async () => {
        await this.#list(session);
        await this.#setInstructions(instructions ?? session.getInstructions() ?? "");
      });
    } catch (error) {
      if (first) await this.dispose(); // nothing half-registered is left behind
      throw error;
    }
  }

  /** List the tools again now; true when the registration changed. */
  refresh(): Promise<boolean> {
    const session = this.#session;
    if (session === undefined) return Promise.reject(new Error("attach() an MCP session first"));
    return this.#serialised(() => this.#list(session));
  }

  /** Wait for the background re-listings asked for so far (by notifications). */
  async settled(): Promise<void> {
    while (this.#following !== undefined) await this.#following;
  }

  /** Stop following the server and dispose the tools, the instructions' variable and its
   * section (idempotent). */
  async dispose(): Promise<void> {
    this.#session = undefined;
    this.#dirty = false;
    await this.#queue.catch(() => undefined);
    const handles = [this.#section, this.#instructions, this.#tools];
    this.#section = this.#instructions = this.#tools = undefined;
    for (const handle of handles) if (handle !== undefined) await handle();
  }

  #schedule(): void {
    this.#dirty = true;
    if (this.#following !== undefined) return;
    const follow = async (): Promise<void> => {
      // Notifications that arrive while a listing runs are answered by one more listing.
      while (this.#dirty && this.#session !== undefined) {
        this.#dirty = false;
        try {
          await this.refresh();
        } catch (error) {
          this.lastError = error;
        }
      }
      this.#following = undefined;
    };
    this.#following = follow();
  }

  #serialised<T>(work: () => Promise<T>): Promise<T> {
    const result = this.#queue.catch(() => undefined).then(work);
    this.#queue = result;
    return result;
  }

  async #list(session: McpSession): Promise<boolean> {
    const listed = await listTools(session);
    this.listings += 1;
    const schemas = listed
      .map((tool) =>
        ToolSchema.fromJson(this.toolName(tool.name), tool.description ?? "", canonicalJson(tool.inputSchema)),
      )
      .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    const wire = canonicalJson(schemas.map((schema) => [schema.name, schema.description, schema.parametersJson()]));
    if (wire === this.#wire) return false;
    if (this.#tools === undefined) {
      this.#tools = await this.#registrar.tools(schemas, { name: this.label });
    } else {
      await this.#tools.update(schemas);
    }
    this.#listed = schemas;
    this.#wire = wire;
    return true;
  }

  async #setInstructions(text: string): Promise<void> {
    if (this.#instructions === undefined) {
      this.#instructions = await this.#registrar.variable(this.variable, text);
      this.#section = await this.#registrar.section(this.label, this.#order, `{{${this.variable}}}`);
    } else if (text !== this.#instructionsText) {
      await this.#instructions.update(text);
    }
    this.#instructionsText = text;
  }
}

type ListedTool = Awaited<ReturnType<McpSession["listTools"]>>["tools"][number];

async function listTools(session: McpSession): Promise<ListedTool[]> {
  const tools: ListedTool[] = [];
  let cursor: string | undefined;
  for (let page = 0; page < MAX_PAGES; page++) {
    const result = await session.listTools(cursor === undefined ? undefined : { cursor });
    tools.push(...result.tools);
    cursor = result.nextCursor;
    if (!cursor) return tools;
  }
  throw new Error(`MCP tools/list still had a next page after ${MAX_PAGES} pages`);
}
