// The mixed fleet's Node worker (fleet_test.go): clients/js's work() on `fleet` tasks until
// SIGTERM, each run printing "ran KEY" and returning {"by": "node"}. Usage: node
// node_worker.mjs URL TOKEN
import { Client } from "../../js/index.js";

const [url, token] = process.argv.slice(2);
const stop = new AbortController();
process.once("SIGTERM", () => stop.abort());
const sleep = (/** @type {number} */ ms) => new Promise((resolve) => setTimeout(resolve, ms));
console.log("working");
await new Client(url, { token }).work(
  ["fleet"],
  async (task) => {
    console.log(`ran ${task.key}`);
    await sleep(2);
    return { by: "node" };
  },
  { concurrency: 8, leaseMs: 10_000, waitMs: 200, signal: stop.signal },
);
