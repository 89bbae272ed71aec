// Starts `mscheduler serve` (or another Python script that prints the same line) on a free
// loopback port, for the tests: python is $MSCHEDULER_PYTHON (default python3), and the
// package is the one of this checkout.
import { spawn } from "node:child_process";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
const PYTHON = process.env.MSCHEDULER_PYTHON ?? "python3";

/**
 * @param {string[]} args what python runs
 * @returns {Promise<{url: string, stop: () => Promise<void>}>}
 */
export function start(args) {
  const child = spawn(PYTHON, args, {
    cwd: ROOT,
    env: { ...process.env, PYTHONPATH: ROOT },
    stdio: ["ignore", "ignore", "pipe"],
  });
  let seen = "";
  return new Promise((resolveStart, reject) => {
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (chunk) => {
      seen += chunk;
      const found = /serve: (http:\/\/\S+?)\/ /.exec(seen);
      if (found) {
        child.stderr.removeAllListeners("data");
        child.stderr.resume();
        resolveStart({
          url: found[1],
          stop: () =>
            new Promise((done) => {
              child.once("exit", () => done());
              child.kill("SIGINT");
            }),
        });
      }
    });
    child.once("exit", (code) => reject(new Error(`the server exited (${code}): ${seen}`)));
  });
}

/** `mscheduler serve` on a private memory:// database. @param {string} token */
export function serve(token) {
  const uri = `memory://js-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
  return start(["-m", "mscheduler", "--uri", uri, "serve", "--port", "0", "--token", token]);
}
