// How work() ends its runs when it stops on an error or the server stops answering: no lease
// is left to expire (an expiry counts an attempt, and may fail a task for good) and no write
// waits for ever; and a wrong URL is never read as a missing task.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, before, test } from "node:test";

import { ApiError, Client } from "../index.js";
import { serve } from "./server.js";

const TOKEN = "js-token-0123456789abcdef";
/** @type {{url: string, stop: () => Promise<void>}} */
let server;

before(async () => {
  server = await serve(TOKEN);
});
after(() => server.stop());

test("get() through a wrong URL throws its 404 instead of answering no task", { timeout: 20_000 }, async () => {
  const elsewhere = new Client(`${server.url}/not-the-api`, { token: TOKEN });
  await assert.rejects(elsewhere.get("any"), (/** @type {any} */ error) => {
    assert.ok(error instanceof ApiError, String(error));
    assert.equal(error.code, "no_route");
    return true;
  });
});

test("a permanent error releases the leases whose handlers it aborts", { timeout: 30_000 }, async () => {
  let started = false;
  /** @type {typeof fetch} */
  const refusingOwn = async (url, init) => {
    if (started && String(url).endsWith("/v1/own")) {
      const body = JSON.stringify({ error: "invalid", message: "names: not taken here" });
      return new Response(body, { status: 422, headers: { "content-type": "application/json" } });
    }
    return fetch(url, init);
  };
  const client = new Client(server.url, { token: TOKEN, fetch: refusingOwn });
  await client.publish("refused:1", "refused", { options: { max_unexpected_retries: 0 } });
  const working = client.work(
    ["refused"],
    async (_, { signal }) => {
      started = true; // the next own is refused for good
      await new Promise((resolve) => signal.addEventListener("abort", resolve));
    },
    { concurrency: 2, leaseMs: 30_000, waitMs: 100 },
  );
  await assert.rejects(working, (/** @type {any} */ error) => error.status === 422);
  const task = await new Client(server.url, { token: TOKEN }).get("refused:1");
  assert.deepEqual(
    [task?.state, task?.worker_states.map((/** @type {any} */ attempt) => attempt.state)],
    ["pending", ["released"]],
    "left running until its lease expires",
  );
});

for (const route of ["/v1/leases/succeed", "/v1/leases/extend"]) {
  test(`work() does not wait for ever on a silent ${route}`, { timeout: 30_000 }, async () => {
    let owned = 0;
    const lease = () => ({
      key: "k",
      worker_id: "w",
      run_id: "r",
      expires_at: new Date(Date.now() + 300).toISOString(),
      task: { key: "k", name: "x" },
    });
    /** @type {Set<import("node:http").ServerResponse>} */
    const hanging = new Set();
    const fake = createServer((request, response) => {
      request.resume();
      if (request.url === route) {
        hanging.add(response); // a server that took the request and went silent
        return;
      }
      response.writeHead(200, { "content-type": "application/json" });
      if (request.url === "/v1/own") {
        owned += 1;
        const leases = owned === 1 ? [lease()] : [];
        setTimeout(() => response.end(JSON.stringify({ leases })), owned === 1 ? 0 : 20);
      } else {
        response.end(JSON.stringify(lease()));
      }
    });
    await new Promise((resolve) => fake.listen(0, "127.0.0.1", () => resolve(null)));
    const { port } = /** @type {import("node:net").AddressInfo} */ (fake.address());
    const stop = new AbortController();
    try {
      const working = new Client(`http://127.0.0.1:${port}`).work(
        ["x"],
        async () => {
          stop.abort(); // a graceful stop: the outcome is still written
          await new Promise((resolve) => setTimeout(resolve, 250));
          return "ok";
        },
        { concurrency: 1, leaseMs: 300, waitMs: 50, signal: stop.signal },
      );
      const late = new Promise((resolve) => setTimeout(() => resolve("late"), 10_000));
      assert.equal(await Promise.race([working.then(() => "returned"), late]), "returned");
    } finally {
      for (const response of hanging) response.destroy();
      fake.close();
    }
  });
}

test("a stop during an own's answer keeps its leases", { timeout: 30_000 }, async () => {
  /** @type {() => void} */
  let resume = () => {};
  const resumed = new Promise((resolve) => {
    resume = () => resolve(null);
  });
  /** @type {() => void} */
  let headed = () => {};
  const headers = new Promise((resolve) => {
    headed = () => resolve(null);
  });
  /** @type {string[]} */
  const ended = [];
  let owned = 0;
  const fake = createServer(async (request, response) => {
    request.resume();
    response.writeHead(200, { "content-type": "application/json" });
    if (request.url !== "/v1/own") {
      ended.push(String(request.url));
      response.end(JSON.stringify({ key: "k" }));
      return;
    }
    owned += 1;
    if (owned > 1) {
      setTimeout(() => response.end(JSON.stringify({ leases: [] })), 20);
      return;
    }
    response.flushHeaders(); // the answer has begun: the server counts its leases as given
    headed();
    await resumed;
    const expires_at = new Date(Date.now() + 10_000).toISOString();
    const lease = { key: "k", worker_id: "w", run_id: "r", expires_at, task: { key: "k", name: "x" } };
    response.end(JSON.stringify({ leases: [lease] }));
  });
  await new Promise((resolve) => fake.listen(0, "127.0.0.1", () => resolve(null)));
  const { port } = /** @type {import("node:net").AddressInfo} */ (fake.address());
  const stop = new AbortController();
  try {
    const working = new Client(`http://127.0.0.1:${port}`).work(["x"], async () => "ok", {
      concurrency: 1,
      leaseMs: 10_000,
      signal: stop.signal,
    });
    await headers;
    await new Promise((resolve) => setTimeout(resolve, 100)); // the worker has the answer's head
    stop.abort();
    await new Promise((resolve) => setTimeout(resolve, 100));
    resume();
    await working;
    assert.deepEqual(ended, ["/v1/leases/succeed"], "the leases of an answer the stop cut short were dropped");
  } finally {
    fake.close();
  }
});
