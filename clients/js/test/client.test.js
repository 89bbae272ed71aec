// The client against `mscheduler serve` (memory://, a free loopback port).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { ApiError, Client, LeaseLost } from "../index.js";
import { serve } from "./server.js";

const TOKEN = "js-token-0123456789abcdef";
/** @type {{url: string, stop: () => Promise<void>}} */
let server;
/** @type {Client} */
let client;

before(async () => {
  server = await serve(TOKEN);
  client = new Client(server.url, { token: TOKEN });
});
after(() => server.stop());

const sleep = (/** @type {number} */ ms) => new Promise((resolve) => setTimeout(resolve, ms));

test("publish is idempotent by key", async () => {
  const first = await client.publish("pub:1", "pub", { payload: { n: 1 } });
  const again = await client.publish("pub:1", "pub", { payload: { n: 2 } });
  assert.equal(first.created, true);
  assert.equal(again.created, false);
  assert.deepEqual(again.task.payload, { n: 1 });
  assert.equal((await client.get("pub:1")).state, "pending");
  assert.equal(await client.get("pub:none"), null);
});

test("a key with a slash is read back", async () => {
  await client.publish("reports/2030/01", "pub");
  assert.equal((await client.get("reports/2030/01")).key, "reports/2030/01");
});

test("a request without the token is refused", async () => {
  const anonymous = new Client(server.url);
  await assert.rejects(anonymous.own(["x"], { workerId: "w" }), (error) => {
    assert.ok(error instanceof ApiError);
    assert.equal(error.status, 401);
    assert.equal(error.code, "unauthorized");
    return true;
  });
});

test("own, extend and succeed", async () => {
  await client.publish("own:1", "own", { payload: 1, options: { priority: 1 } });
  await client.publish("own:2", "own", { payload: 2 });
  const leases = await client.own(["own"], { workerId: "js", maxTasks: 5, leaseMs: 10_000 });
  assert.deepEqual(leases.map((lease) => lease.key), ["own:1", "own:2"]);
  const extended = await client.extend(leases[0], 20_000);
  assert.equal(extended.run_id, leases[0].run_id);
  assert.ok(Date.parse(extended.expires_at) > Date.parse(leases[0].expires_at));
  const done = await client.succeed(extended, { ok: true });
  assert.equal(done.state, "success");
  assert.deepEqual(done.result, { ok: true });
  await assert.rejects(client.succeed(leases[0]), LeaseLost);
  assert.equal((await client.release(leases[1])).state, "pending");
});

test("fail retries by the task's rules; release counts no attempt", async () => {
  const options = { max_unexpected_retries: 0 };
  await client.publish("fail:1", "fail", { options });
  let [lease] = await client.own(["fail"], { workerId: "js" });
  await client.release(lease);
  [lease] = await client.own(["fail"], { workerId: "js" });
  assert.equal((await client.fail(lease, new Error("broken"))).state, "fail");
});

test("a lease is fenced once it has expired", async () => {
  await client.publish("late:1", "late");
  const [lease] = await client.own(["late"], { workerId: "slow", leaseMs: 100 });
  await sleep(250);
  await assert.rejects(client.extend(lease, 1_000), LeaseLost);
  const [taken] = await client.own(["late"], { workerId: "quick" });
  assert.equal(taken.key, "late:1");
  await assert.rejects(client.succeed(lease), LeaseLost);
  assert.equal((await client.succeed(taken)).state, "success");
});

test("own waits for a task published meanwhile", async () => {
  const owning = client.own(["wait"], { workerId: "js", waitMs: 10_000 });
  await sleep(100);
  await client.publish("wait:1", "wait");
  const leases = await owning;
  assert.deepEqual(leases.map((lease) => lease.key), ["wait:1"]);
});

test("work runs each task once, extends long ones, and records the outcome", async () => {
  const keys = Array.from({ length: 20 }, (_, n) => `work:${n}`);
  for (const key of keys) await client.publish(key, "work", { payload: key });
  await client.publish("work:bad", "work", { payload: "bad", options: { max_unexpected_retries: 0 } });
  const stop = new AbortController();
  /** @type {string[]} */
  const ran = [];
  const working = client.work(
    ["work"],
    async (task) => {
      ran.push(task.key);
      if (task.payload === "bad") throw new Error("no");
      if (task.key === "work:0") await sleep(2_500); // outlives its first lease: extended
      return { echoed: task.payload };
    },
    { concurrency: 4, leaseMs: 1_000, waitMs: 200, signal: stop.signal },
  );
  for (let tries = 0; tries < 200; tries += 1) {
    const tasks = await Promise.all([...keys, "work:bad"].map((key) => client.get(key)));
    if (tasks.every((task) => ["success", "fail"].includes(task.state))) break;
    await sleep(50);
  }
  stop.abort();
  await working;
  assert.equal(ran.length, 21);
  assert.deepEqual(new Set(ran).size, 21);
  for (const key of keys) {
    const task = await client.get(key);
    assert.equal(task.state, "success", key);
    assert.deepEqual(task.result, { echoed: key });
    assert.equal(task.worker_states.length, 1, key);
  }
  assert.equal((await client.get("work:bad")).state, "fail");
});

test("wait returns the ended task, or throws 408", async () => {
  await client.publish("waited:1", "waited", { debounceMs: 0 });
  await assert.rejects(client.wait("waited:1", { timeoutMs: 50 }), (error) => {
    assert.ok(error instanceof ApiError);
    assert.equal(error.status, 408);
    return true;
  });
  const [lease] = await client.own(["waited"], { workerId: "js" });
  await client.succeed(lease, 7);
  assert.equal((await client.wait("waited:1")).result, 7);
});
