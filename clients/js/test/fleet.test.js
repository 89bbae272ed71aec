// A mixed fleet: Python consumers and a Node worker drain one collection; every task runs
// once, and both halves run some.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Client } from "../index.js";
import { start } from "./server.js";

const sleep = (/** @type {number} */ ms) => new Promise((resolve) => setTimeout(resolve, ms));

test("Python consumers and a Node worker run every task once", async (t) => {
  const server = await start(["clients/js/test/fleet_server.py", "--consumers", "2", "--token", "t"]);
  try {
    const client = new Client(server.url, { token: "t" });
    const stop = new AbortController();
    const working = client.work(
      ["fleet"],
      async () => {
        await sleep(2);
        return { by: "node" };
      },
      { concurrency: 8, leaseMs: 10_000, waitMs: 200, signal: stop.signal },
    );
    const keys = Array.from({ length: 300 }, (_, n) => `fleet:${n}`);
    for (const key of keys) await client.publish(key, "fleet", { payload: key });
    /** @type {any[]} */
    let tasks = [];
    for (let tries = 0; tries < 600; tries += 1) {
      tasks = await Promise.all(keys.map((key) => client.get(key)));
      if (tasks.every((task) => task.state === "success")) break;
      await sleep(50);
    }
    stop.abort();
    await working;
    const by = { node: 0, python: 0 };
    for (const task of tasks) {
      assert.equal(task.state, "success", task.key);
      assert.equal(task.worker_states.length, 1, `${task.key} ran ${task.worker_states.length} times`);
      by[task.result.by] += 1;
    }
    assert.equal(by.node + by.python, keys.length);
    t.diagnostic(`runs: ${JSON.stringify(by)}`);
    assert.ok(by.node > 0 && by.python > 0, JSON.stringify(by));
  } finally {
    await server.stop();
  }
});
