/** A real sidecar for the tests: `dsh-system-prompt serve` from the repository's .venv. */

import { spawn, type ChildProcessByStdio } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import type { Readable } from "node:stream";
import { fileURLToPath } from "node:url";

/** The repository's root, from dist/test/ (compiled) or test/ (source). */
export const REPOSITORY = fileURLToPath(new URL("../../../../", import.meta.url));
const SIDECAR = process.env["DSP_SIDECAR"] ?? join(REPOSITORY, ".venv", "bin", "dsh-system-prompt");
const READY = "listening on ";
const START_TIMEOUT_MS = 30_000;

/** Options of the sidecar: its config file's keys, and command-line flags. */
export interface SidecarOptions {
  /** TOML lines of the config file, e.g. `provider_timeout_s = 1`. */
  config?: string[];
  /** Extra `serve` flags, e.g. `["--auth-token-file", path]`. */
  flags?: string[];
  /** What to listen on; default a free loopback port. */
  listen?: string;
}

/** A sidecar child process serving at `address` until stopped. */
export class Sidecar {
  readonly address: string;
  readonly #process: ChildProcessByStdio<null, Readable, Readable>;
  readonly #exited: Promise<number | null>;
  #log = "";

  private constructor(
    process: ChildProcessByStdio<null, Readable, Readable>,
    exited: Promise<number | null>,
    address: string,
    log: string,
  ) {
    this.#process = process;
    this.#exited = exited;
    this.address = address;
    this.#log = log;
    process.stderr.on("data", (chunk: Buffer) => {
      this.#log += chunk.toString();
    });
  }

  /** Start a sidecar; resolves once it printed `listening on <address>`. */
  static async start(options: SidecarOptions = {}): Promise<Sidecar> {
    const argv = ["serve", "--listen", options.listen ?? "127.0.0.1:0", ...(options.flags ?? [])];
    if (options.config?.length) {
      const path = join(mkdtempSync(join(tmpdir(), "dsp-ts-")), "sidecar.toml");
      writeFileSync(path, options.config.join("\n") + "\n");
      argv.push("--config", path);
    }
    const child = spawn(SIDECAR, argv, { stdio: ["ignore", "pipe", "pipe"] });
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    let log = "";
    child.stderr.on("data", (chunk: Buffer) => {
      log += chunk.toString();
    });
    const address = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`the sidecar did not start:\n${log}`)), START_TIMEOUT_MS);
      child.once("error", reject);
      void exited.then((code) => reject(new Error(`the sidecar exited with ${code}:\n${log}`)));
      createInterface({ input: child.stdout }).on("line", (line) => {
        const at = line.indexOf(READY);
        if (at >= 0) {
          clearTimeout(timer);
          resolve(line.slice(at + READY.length).trim());
        }
      });
    });
    child.stderr.removeAllListeners("data");
    return new Sidecar(child, exited, address, log);
  }

  /**
   * Start a sidecar on the `address` another one just left. Another process on this
   * machine may hold that port for a moment (an ephemeral port of its own): retry then.
   */
  static async restartAt(address: string, options: SidecarOptions = {}): Promise<Sidecar> {
    for (let attempt = 1; ; attempt += 1) {
      try {
        return await Sidecar.start({ ...options, listen: address });
      } catch (error) {
        if (attempt >= 50 || !String(error).includes("address in use")) throw error;
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    }
  }

  /** SIGTERM, and wait for the exit. */
  async stop(): Promise<void> {
    if (this.#process.exitCode === null && this.#process.signalCode === null) this.#process.kill("SIGTERM");
    await this.#exited;
  }

  /** What the sidecar logged so far. */
  get log(): string {
    return this.#log;
  }
}

/** A temporary folder for one test's files. */
export function temporaryFolder(): string {
  return mkdtempSync(join(tmpdir(), "dsp-ts-"));
}
