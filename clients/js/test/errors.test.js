// work() fails loudly: an error retrying cannot mend stops it with that error; a transient
// one is reported to onError each time and tried again.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, before, test } from "node:test";

import { ApiError, Client, isPermanent } from "../index.js";
import { serve } from "./server.js";

const TOKEN = "js-token-0123456789abcdef";
/** @type {{url: string, stop: () => Promise<void>}} */
let server;

before(async () => {
  server = await serve(TOKEN);
});
after(() => server.stop());

const handler = async () => null;

/**
 * A server of our own that answers each request with the next of `replies`, then the last.
 * @param {Array<[number, any]>} replies
 * @returns {Promise<{url: string, close: () => void, seen: () => number}>}
 */
function scripted(replies) {
  let seen = 0;
  const http = createServer((request, response) => {
    const [status, body] = replies[Math.min(seen, replies.length - 1)];
    seen += 1;
    request.resume();
    const html = typeof body === "string"; // another web server's page
    response.writeHead(status, { "content-type": html ? "text/html" : "application/json" });
    response.end(html ? body : JSON.stringify(body));
  });
  return new Promise((resolve) => {
    http.listen(0, "127.0.0.1", () => {
      const { port } = /** @type {import("node:net").AddressInfo} */ (http.address());
      resolve({ url: `http://127.0.0.1:${port}`, close: () => http.close(), seen: () => seen });
    });
  });
}

/** @param {number} status @param {string} code */
const refusedWith = (status, code) => (/** @type {any} */ error) => {
  assert.ok(error instanceof ApiError, String(error));
  assert.equal(error.status, status);
  assert.equal(error.code, code);
  return true;
};

test("a wrong token stops work with 401", { timeout: 20_000 }, async () => {
  const wrong = new Client(server.url, { token: "wrong-token-0123456789" });
  const reported = [];
  await assert.rejects(
    wrong.work(["x"], handler, { waitMs: 100, onError: (error) => reported.push(error) }),
    refusedWith(401, "unauthorized"),
  );
  assert.deepEqual(reported, []);
});

test("a route the server does not have stops work with 404", { timeout: 20_000 }, async () => {
  const elsewhere = new Client(`${server.url}/not-the-api`, { token: TOKEN });
  await assert.rejects(elsewhere.work(["x"], handler, { waitMs: 100 }), refusedWith(404, "no_route"));
});

test("a URL that is another web server's stops work with its 404", { timeout: 20_000 }, async () => {
  const other = await scripted([[404, "<html><body>Not Found</body></html>"]]);
  try {
    await assert.rejects(new Client(other.url).work(["x"], handler, { waitMs: 100 }), refusedWith(404, "http_error"));
  } finally {
    other.close();
  }
});

test("a body the server refuses stops work with 422", { timeout: 20_000 }, async () => {
  const client = new Client(server.url, { token: TOKEN });
  await assert.rejects(client.work([], handler, { waitMs: 100 }), refusedWith(422, "invalid"));
});

test("a server that is down is reported each time and tried again", { timeout: 20_000 }, async () => {
  const gone = await scripted([[200, {}]]);
  gone.close(); // the port is free: connection refused
  const client = new Client(gone.url);
  const stop = new AbortController();
  /** @type {unknown[]} */
  const reported = [];
  const working = client.work(["x"], handler, {
    waitMs: 100,
    signal: stop.signal,
    onError: (error, lease) => {
      assert.equal(lease, null);
      reported.push(error);
      if (reported.length === 3) stop.abort();
    },
  });
  await working; // a graceful stop: resolves
  assert.equal(reported.length, 3);
  assert.ok(reported.every((error) => !isPermanent(error)));
});

test("503 while the server starts is retried, then a permanent error stops work", { timeout: 20_000 }, async () => {
  const unavailable = [503, { error: "unavailable", message: "MongoDB unreachable" }];
  const fake = await scripted([unavailable, unavailable, [401, { error: "unauthorized", message: "no" }]]);
  const client = new Client(fake.url);
  /** @type {any[]} */
  const reported = [];
  try {
    await assert.rejects(
      client.work(["x"], handler, { waitMs: 100, onError: (error) => reported.push(error) }),
      refusedWith(401, "unauthorized"),
    );
  } finally {
    fake.close();
  }
  assert.deepEqual(
    reported.map((error) => [error.status, error.code]),
    [
      [503, "unavailable"],
      [503, "unavailable"],
    ],
  );
  assert.equal(fake.seen(), 3);
});

test("a permanent error aborts the running handlers' signals and waits for them", { timeout: 20_000 }, async () => {
  const client = new Client(server.url, { token: TOKEN });
  await client.publish("stopped:1", "stopped");
  /** @type {{signal: AbortSignal} | undefined} */
  let running;
  let finished = false;
  // The handler's lease extension is refused once the token is wrong: work stops.
  const working = client.work(
    ["stopped"],
    async (_, context) => {
      running = context;
      client.token = "revoked-token-0123456789";
      await new Promise((resolve) => context.signal.addEventListener("abort", resolve));
      finished = true;
    },
    { leaseMs: 300, waitMs: 100 },
  );
  await assert.rejects(working, refusedWith(401, "unauthorized"));
  assert.ok(running?.signal.aborted);
  assert.ok(finished);
  client.token = TOKEN;
});
