/** Bearer token on every call and stream; TLS and mutual TLS. */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import * as dsp from "../src/index.js";
import { failure, ownSections } from "./helpers.js";
import { Sidecar, temporaryFolder } from "./sidecar.js";

const TOKEN = "s3cret-token-for-tests";

/** A throwaway CA, a server certificate for localhost/127.0.0.1 and a client one. */
function certificates(): string {
  const folder = temporaryFolder();
  const openssl = (...args: string[]): void => {
    execFileSync("openssl", args, { cwd: folder, stdio: "ignore" });
  };
  openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca", "-keyout", "ca.key", "-out", "ca.pem");
  for (const [name, extension] of [
    ["server", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
    ["client", "extendedKeyUsage=clientAuth"],
  ] as const) {
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", `/CN=${name}`, "-keyout", `${name}.key`, "-out", `${name}.csr`);
    writeFileSync(join(folder, `${name}.ext`), extension + "\n");
    openssl("x509", "-req", "-in", `${name}.csr`, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2", "-extfile", `${name}.ext`, "-out", `${name}.pem`);
  }
  return folder;
}

async function exercise(client: dsp.Client): Promise<void> {
  const changes = await client.watchChanges();
  await client.section("rules", 1, () => "Dynamic over a secured stream.");
  await client.onAssemble((_assembly, _context, next) => next());
  assert.deepEqual(ownSections(await client.assemble()), ["rules"]);
  changes.close();
}

test("the bearer token is required, and opens sessions, streams and calls", async () => {
  const folder = temporaryFolder();
  writeFileSync(join(folder, "token"), TOKEN + "\n");
  const sidecar = await Sidecar.start({ flags: ["--auth-token-file", join(folder, "token")] });
  try {
    const missing = await failure(dsp.connect(sidecar.address));
    assert.equal(missing.code, dsp.Code.UNAUTHENTICATED);
    const wrong = await failure(dsp.connect(sidecar.address, { token: "not-the-token" }));
    assert.equal(wrong.code, dsp.Code.UNAUTHENTICATED);
    assert.match(wrong.message, /bearer token/);
    const client = await dsp.connect(sidecar.address, { token: TOKEN });
    await exercise(client);
    await client.close();
  } finally {
    await sidecar.stop();
  }
});

test("TLS, and mutual TLS with a client certificate", async () => {
  const pki = certificates();
  const file = (name: string): { path: string } => ({ path: join(pki, name) });
  const sidecar = await Sidecar.start({
    flags: ["--tls-cert", join(pki, "server.pem"), "--tls-key", join(pki, "server.key"), "--tls-client-ca", join(pki, "ca.pem")],
  });
  try {
    const address = sidecar.address.replace("127.0.0.1", "localhost");
    const anonymous = await failure(dsp.connect(address, { tls: { rootCertificates: file("ca.pem") } }));
    assert.equal(anonymous.code, dsp.Code.UNAVAILABLE);
    const client = await dsp.connect(address, {
      tls: { rootCertificates: file("ca.pem"), privateKey: file("client.key"), certificateChain: file("client.pem") },
    });
    await exercise(client);
    await client.close();
  } finally {
    await sidecar.stop();
  }
});
