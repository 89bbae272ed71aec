// mscheduler's HTTP API from Node 18+ (no dependencies: the global fetch).
//
//   import { Client } from "mscheduler-client";
//   const client = new Client("http://127.0.0.1:8700", { token: process.env.MSCHEDULER_HTTP_TOKEN });
//   await client.publish("email:42", "email", { payload: { to: "a@b.c" } });
//   await client.work(["email"], async (task) => send(task.payload), { concurrency: 8 });
//
// The words are the protocol's (docs/protocol.md): own, extend, succeed, fail, release.
// Every write of a lease is fenced by its run_id: once the lease is gone it throws LeaseLost.

/**
 * A task as the API returns it: the document's fields, times as ISO 8601 strings, BSON
 * values beyond JSON as relaxed extended JSON.
 * @typedef {{key: string, name: string, state: string, payload: any, result: any,
 *   options: Record<string, any>, worker_states: Array<Record<string, any>>,
 *   [field: string]: any}} Task
 */

/**
 * A lease: the three fields that fence its writes, when it ends unless extended, the task.
 * @typedef {{key: string, worker_id: string, run_id: string, expires_at: string | null,
 *   task: Task}} Lease
 */

/**
 * @typedef {object} PublishOptions
 * @property {any} [payload]
 * @property {Record<string, any>} [options] priority, max_unexpected_retries, ... (TaskOptions)
 * @property {string[]} [dependsOn] keys this task waits for
 * @property {number} [delayMs] not claimable before this long from now
 */

/**
 * @typedef {object} OwnOptions
 * @property {string} workerId
 * @property {number} [maxTasks] at most this many (default 1)
 * @property {number} [leaseMs] each lease's length (default: the task's worker_timeout_ms)
 * @property {number} [waitMs] when none is claimable, wait up to this long for one
 * @property {AbortSignal} [signal]
 */

/**
 * @typedef {object} WorkOptions
 * @property {number} [concurrency] handlers at once (default 4)
 * @property {number} [leaseMs] each lease's length, extended every third of it (default 30000)
 * @property {string} [workerId] default: node-<pid>-<random>
 * @property {number} [waitMs] how long one own() waits for a task (default 5000)
 * @property {AbortSignal} [signal] stops owning; running handlers finish
 * @property {(error: unknown, lease: Lease) => void} [onError] an outcome that could not be
 *   written (the server unreachable): the lease expires and the task is retried by its rules
 */

/**
 * The handler of `work`: its return value is stored as the result; a throw fails the attempt
 * (retried by the task's rules). `signal` aborts when the lease is lost.
 * @callback Handler
 * @param {Task} task
 * @param {{lease: Lease, signal: AbortSignal}} context
 * @returns {any | Promise<any>}
 */

/** An error the API answered with: `code` is its `error` field, `status` the HTTP status. */
export class ApiError extends Error {
  /** @param {number} status @param {string} code @param {string} message */
  constructor(status, code, message) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
  }
}

/** The lease is gone (expired, taken over, the task cancelled or ended): stop working on it. */
export class LeaseLost extends ApiError {
  /** @param {string} message */
  constructor(message) {
    super(409, "lease_lost", message);
    this.name = "LeaseLost";
  }
}

const sleep = (/** @type {number} */ ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** @param {Lease} lease */
const fence = (lease) => ({ key: lease.key, worker_id: lease.worker_id, run_id: lease.run_id });

export class Client {
  /**
   * @param {string} url the server, e.g. http://127.0.0.1:8700
   * @param {{token?: string, fetch?: typeof fetch}} [settings]
   */
  constructor(url, settings = {}) {
    this.url = url.replace(/\/+$/, "");
    this.token = settings.token;
    this.fetch = settings.fetch ?? globalThis.fetch;
  }

  /**
   * @param {string} method @param {string} path @param {any} [body]
   * @param {AbortSignal} [signal]
   * @returns {Promise<{status: number, body: any}>}
   */
  async request(method, path, body, signal) {
    /** @type {Record<string, string>} */
    const headers = { accept: "application/json" };
    if (body !== undefined) headers["content-type"] = "application/json";
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    const reply = await this.fetch(`${this.url}/v1${path}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
    const text = await reply.text();
    const data = text ? JSON.parse(text) : null;
    if (reply.status >= 400) {
      const code = data?.error ?? "http_error";
      const message = data?.message ?? `HTTP ${reply.status}`;
      throw code === "lease_lost" ? new LeaseLost(message) : new ApiError(reply.status, code, message);
    }
    return { status: reply.status, body: data };
  }

  /**
   * Publish a task, idempotently by key.
   * @param {string} key @param {string} name @param {PublishOptions} [options]
   * @returns {Promise<{task: Task, created: boolean}>}
   */
  async publish(key, name, options = {}) {
    const reply = await this.request("POST", "/tasks", {
      key,
      name,
      payload: options.payload ?? null,
      options: options.options,
      depends_on: options.dependsOn ?? [],
      delay_ms: options.delayMs,
    });
    return { task: reply.body, created: reply.status === 201 };
  }

  /** @param {string} key @returns {Promise<Task | null>} */
  async get(key) {
    try {
      return (await this.request("GET", `/tasks/${encodeURIComponent(key)}`)).body;
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) return null;
      throw error;
    }
  }

  /**
   * Own up to maxTasks tasks of names, best first.
   * @param {string[]} names @param {OwnOptions} options
   * @returns {Promise<Lease[]>}
   */
  async own(names, options) {
    const reply = await this.request(
      "POST",
      "/own",
      {
        names,
        worker_id: options.workerId,
        max_tasks: options.maxTasks ?? 1,
        lease_ms: options.leaseMs,
        wait_ms: options.waitMs,
      },
      options.signal,
    );
    return reply.body.leases;
  }

  /**
   * The lease extended to leaseMs from now (the task's worker_timeout_ms by default).
   * @param {Lease} lease @param {number} [leaseMs] @returns {Promise<Lease>}
   */
  async extend(lease, leaseMs) {
    return (await this.request("POST", "/leases/extend", { ...fence(lease), lease_ms: leaseMs })).body;
  }

  /** @param {Lease} lease @param {any} [result] @returns {Promise<Task>} */
  async succeed(lease, result = null) {
    return (await this.request("POST", "/leases/succeed", { ...fence(lease), result })).body;
  }

  /**
   * The attempt failed: the task is retried by its rules.
   * @param {Lease} lease @param {unknown} error @returns {Promise<Task>}
   */
  async fail(lease, error) {
    const text = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    return (await this.request("POST", "/leases/fail", { ...fence(lease), error: text || "failed" })).body;
  }

  /** Hand the task back unrun: claimable at once, no attempt counted. @param {Lease} lease */
  async release(lease) {
    return (await this.request("POST", "/leases/release", fence(lease))).body;
  }

  /**
   * Own tasks of names and run handler on each, up to concurrency at once, extending each
   * lease while its handler runs and returning the outcome. Resolves once signal aborts and
   * the running handlers have finished.
   * @param {string[]} names @param {Handler} handler @param {WorkOptions} [options]
   */
  async work(names, handler, options = {}) {
    const concurrency = options.concurrency ?? 4;
    const leaseMs = options.leaseMs ?? 30_000;
    const workerId = options.workerId ?? `node-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
    const signal = options.signal;
    /** @type {Set<Promise<void>>} */
    const running = new Set();
    let failures = 0;
    while (!signal?.aborted) {
      const free = concurrency - running.size;
      if (free <= 0) {
        await Promise.race(running);
        continue;
      }
      let leases;
      try {
        leases = await this.own(names, {
          workerId,
          maxTasks: free,
          leaseMs,
          waitMs: options.waitMs ?? 5_000,
          signal,
        });
        failures = 0;
      } catch (error) {
        if (signal?.aborted) break;
        failures += 1; // the server is unreachable or refused: back off, then ask again
        await sleep(Math.min(5_000, 100 * 2 ** Math.min(failures, 6)));
        continue;
      }
      for (const lease of leases) {
        const run = this.#run(lease, handler, leaseMs, options.onError).finally(() =>
          running.delete(run),
        );
        running.add(run);
      }
    }
    await Promise.allSettled(running);
  }

  /**
   * One lease's run; never throws (work's other runs go on).
   * @param {Lease} lease @param {Handler} handler @param {number} leaseMs
   * @param {((error: unknown, lease: Lease) => void) | undefined} onError
   */
  async #run(lease, handler, leaseMs, onError) {
    const lost = new AbortController();
    let current = lease;
    const keeper = setInterval(async () => {
      try {
        current = await this.extend(current, leaseMs);
      } catch (error) {
        if (error instanceof LeaseLost) lost.abort(error);
      }
    }, Math.max(10, Math.floor(leaseMs / 3)));
    try {
      let result;
      try {
        result = await handler(lease.task, { lease, signal: lost.signal });
      } catch (error) {
        if (!lost.signal.aborted) await this.fail(current, error);
        return;
      }
      if (!lost.signal.aborted) await this.succeed(current, result ?? null);
    } catch (error) {
      // LeaseLost: another worker has it now. Anything else: the outcome was not written.
      if (!(error instanceof LeaseLost)) onError?.(error, lease);
    } finally {
      clearInterval(keeper);
    }
  }
}
