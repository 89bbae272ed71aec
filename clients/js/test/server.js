// Starts `mscheduler serve` (or another Python script that prints the same line) on a free
// loopback port, for the tests. The package is the one of this checkout; the Python is
// $MSCHEDULER_PYTHON, else the checkout's .venv (the project's set-up makes it), else
// python3, the first of them that imports mscheduler's HTTP API.
import { spawn, spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");

/** @returns {string} a Python that runs this checkout's `mscheduler serve` */
function findPython() {
  const given = process.env.MSCHEDULER_PYTHON;
  const venv = [join(ROOT, ".venv", "bin", "python"), join(ROOT, ".venv", "Scripts", "python.exe")];
  const candidates = given ? [given] : [...venv.filter((path) => existsSync(path)), "python3"];
  for (const python of candidates) {
    const check = spawnSync(python, ["-c", "import mscheduler.http, uvicorn"], {
      cwd: ROOT,
      env: { ...process.env, PYTHONPATH: ROOT },
      stdio: "ignore",
    });
    if (check.status === 0) return python;
  }
  throw new Error(
    `no Python here runs mscheduler serve (tried ${candidates.join(", ")}): run the project's ` +
      "set-up at its root (python3 -m venv .venv && .venv/bin/pip install -e '.[http]'), or set " +
      "MSCHEDULER_PYTHON to a Python that has it",
  );
}

/** @type {string | undefined} */
let python;

/**
 * @param {string[]} args what python runs
 * @returns {Promise<{url: string, stop: () => Promise<void>}>}
 */
export function start(args) {
  python ??= findPython();
  const child = spawn(python, args, {
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
