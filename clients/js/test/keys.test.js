// A key in a path: fetch resolves the segments "." and ".." (and their percent-encoded forms)
// as a URL's dot segments, so such a key would name another route (get(".") read the task
// list as a task, wait(".") waited for the task "wait"). The client refuses them instead.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Client } from "../index.js";

test("a key fetch cannot put in a path is refused before any request", async () => {
  /** @type {string[]} */
  const sent = [];
  /** @type {typeof fetch} */
  const recording = async (url) => {
    sent.push(String(url));
    return new Response("{}", { status: 200, headers: { "content-type": "application/json" } });
  };
  const client = new Client("http://127.0.0.1:9", { fetch: recording });
  for (const key of [".", ".."]) {
    for (const call of [() => client.get(key), () => client.wait(key)]) {
      await assert.rejects(call(), (/** @type {any} */ error) => {
        assert.ok(error instanceof TypeError, String(error));
        assert.match(error.message, /^key: /);
        return true;
      });
    }
  }
  assert.deepEqual(sent, []);
});

test("every other key reaches its own route, encoded as one segment", async () => {
  /** @type {string[]} */
  const sent = [];
  /** @type {typeof fetch} */
  const recording = async (url) => {
    sent.push(new URL(String(url)).pathname);
    return new Response("{}", { status: 200, headers: { "content-type": "application/json" } });
  };
  const client = new Client("http://127.0.0.1:9", { fetch: recording });
  for (const key of ["...", "a/b", "100%", "ключ ☃", "?#", ".a"]) await client.get(key);
  assert.deepEqual(sent, [
    "/v1/tasks/...",
    "/v1/tasks/a%2Fb",
    "/v1/tasks/100%25",
    "/v1/tasks/%D0%BA%D0%BB%D1%8E%D1%87%20%E2%98%83",
    "/v1/tasks/%3F%23",
    "/v1/tasks/.a",
  ]);
});
