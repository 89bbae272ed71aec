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
 * @property {number} [debounceMs] start this long from now; a publish of the key again before
 *   it started gives it the new payload and pushes its start back
 * @property {boolean} [updatePayload] an existing task not running gets the new payload
 * @property {boolean} [replaceFinished] a finished task is published anew
 * @property {boolean} [allowMissing] a dependency that does not exist counts as met
 */

/**
 * @typedef {object} OwnOptions
 * @property {string} workerId
 * @property {number} [maxTasks] at most this many (default 1)
 * @property {number} [leaseMs] each lease's length (default: the task's worker_timeout_ms)
 * @property {number} [waitMs] when none is claimable, wait up to this long for one
 * @property {AbortSignal} [signal]
 * @property {() => void} [onAnswer] called once the answer has begun to arrive
 */

/**
 * @typedef {object} WorkOptions
 * @property {number} [concurrency] handlers at once (default 4)
 * @property {number} [leaseMs] each lease's length, extended every third of it (default 30000)
 * @property {string} [workerId] default: node-<pid>-<random>
 * @property {number} [waitMs] how long one own() waits for a task (default 5000)
 * @property {AbortSignal} [signal] stops owning; running handlers finish
 * @property {(error: unknown, lease: Lease | null) => void} [onError] each transient error
 *   (the server unreachable, starting or failing), as it happens; `lease` is the run it hit,
 *   null for an own. The request is tried again, after a growing wait.
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

/**
 * Waits ms, or less if signal aborts first.
 * @param {number} ms @param {AbortSignal} [signal] @returns {Promise<void>}
 */
const sleep = (ms, signal) =>
  new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });

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
   * @param {() => void} [onAnswer] called once the answer has begun to arrive (its head)
   * @returns {Promise<{status: number, body: any}>}
   */
  async request(method, path, body, signal, onAnswer) {
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
    onAnswer?.();
    const text = await reply.text();
    if (reply.status >= 400) {
      // Our errors are JSON; a proxy's or another server's page is not.
      const data = parsed(text);
      const code = data?.error ?? "http_error";
      const message = data?.message ?? `HTTP ${reply.status}: ${text.trim().slice(0, 200)}`;
      throw code === "lease_lost" ? new LeaseLost(message) : new ApiError(reply.status, code, message);
    }
    return { status: reply.status, body: text ? JSON.parse(text) : null };
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
      debounce_ms: options.debounceMs,
      update_payload: options.updatePayload,
      replace_finished: options.replaceFinished,
      allow_missing: options.allowMissing,
    });
    return { task: reply.body, created: reply.status === 201 };
  }

  /**
   * The task once it has ended (success, fail or cancelled). Throws an ApiError: 408
   * `timeout` if it has not within timeoutMs (default 30000, at most 300000), 404 if there
   * is no such task.
   * @param {string} key @param {{timeoutMs?: number, signal?: AbortSignal}} [options]
   * @returns {Promise<Task>}
   */
  async wait(key, options = {}) {
    const query = `timeout_ms=${options.timeoutMs ?? 30_000}`;
    const path = `/tasks/${segment(key)}/wait?${query}`;
    return (await this.request("GET", path, undefined, options.signal)).body;
  }

  /** @param {string} key @returns {Promise<Task | null>} */
  async get(key) {
    try {
      return (await this.request("GET", `/tasks/${segment(key)}`)).body;
    } catch (error) {
      if (error instanceof ApiError && error.code === "not_found") return null;
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
      options.onAnswer,
    );
    return reply.body.leases;
  }

  /**
   * The lease extended to leaseMs from now (the task's worker_timeout_ms by default).
   * @param {Lease} lease @param {number} [leaseMs] @param {{signal?: AbortSignal}} [options]
   * @returns {Promise<Lease>}
   */
  async extend(lease, leaseMs, options = {}) {
    const body = { ...fence(lease), lease_ms: leaseMs };
    return (await this.request("POST", "/leases/extend", body, options.signal)).body;
  }

  /**
   * @param {Lease} lease @param {any} [result] @param {{signal?: AbortSignal}} [options]
   * @returns {Promise<Task>}
   */
  async succeed(lease, result = null, options = {}) {
    return (await this.request("POST", "/leases/succeed", { ...fence(lease), result }, options.signal)).body;
  }

  /**
   * The attempt failed: the task is retried by its rules.
   * @param {Lease} lease @param {unknown} error @param {{signal?: AbortSignal}} [options]
   * @returns {Promise<Task>}
   */
  async fail(lease, error, options = {}) {
    const text = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    const body = { ...fence(lease), error: text || "failed" };
    return (await this.request("POST", "/leases/fail", body, options.signal)).body;
  }

  /**
   * Hand the task back unrun: claimable at once, no attempt counted.
   * @param {Lease} lease @param {{signal?: AbortSignal}} [options] @returns {Promise<Task>}
   */
  async release(lease, options = {}) {
    return (await this.request("POST", "/leases/release", fence(lease), options.signal)).body;
  }

  /**
   * Own tasks of names and run handler on each, up to concurrency at once, extending each
   * lease while its handler runs and returning the outcome. Resolves once signal aborts and
   * the running handlers have finished. Rejects with the error when the server answers with
   * one that retrying cannot mend (`isPermanent`: a wrong token, Origin, route or body),
   * after telling the running handlers (their signal aborts) and waiting for them. Any
   * other error (the server unreachable, starting or failing) is reported to onError and
   * the request retried, waiting longer each time.
   * @param {string[]} names @param {Handler} handler @param {WorkOptions} [options]
   * @returns {Promise<void>}
   */
  async work(names, handler, options = {}) {
    const concurrency = options.concurrency ?? 4;
    const leaseMs = options.leaseMs ?? 30_000;
    const workerId = options.workerId ?? `node-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
    const stopping = new AbortController(); // the caller's signal, or a permanent error
    const broken = new AbortController(); // a permanent error: the handlers are told
    const onAbort = () => stopping.abort();
    options.signal?.addEventListener("abort", onAbort, { once: true });
    if (options.signal?.aborted) stopping.abort();
    /** @type {unknown} */
    let permanent;
    /** @type {Worker} */
    const worker = {
      report: (error, lease) => {
        try {
          options.onError?.(error, lease);
        } catch {
          // the callback's own failure must not stop the worker
        }
      },
      stopWith: (error) => {
        if (permanent === undefined) permanent = error;
        broken.abort(error);
        stopping.abort();
      },
      broken: broken.signal,
    };
    /** @type {Set<Promise<void>>} */
    const running = new Set();
    const stopped = aborted(stopping.signal);
    let failures = 0;
    try {
      while (!stopping.signal.aborted) {
        const free = concurrency - running.size;
        if (free <= 0) {
          await Promise.race([...running, stopped]);
          continue;
        }
        let leases;
        // A stop closes a waiting own only while no answer has begun to arrive: the server
        // releases what a request it sees closed had won, but an answer it has begun to send
        // is the only record of its leases, so that one is read to its end (and its leases
        // run, as a graceful stop lets running handlers finish).
        const asking = new AbortController();
        let answering = false;
        const onStop = () => {
          if (!answering) asking.abort();
        };
        stopping.signal.addEventListener("abort", onStop, { once: true });
        try {
          leases = await this.own(names, {
            workerId,
            maxTasks: free,
            leaseMs,
            waitMs: options.waitMs ?? 5_000,
            signal: asking.signal,
            onAnswer: () => {
              answering = true;
            },
          });
          failures = 0;
        } catch (error) {
          if (stopping.signal.aborted) break;
          if (isPermanent(error)) {
            worker.stopWith(error);
            break;
          }
          failures += 1;
          worker.report(error, null);
          await sleep(backoff(failures), stopping.signal);
          continue;
        } finally {
          stopping.signal.removeEventListener("abort", onStop);
        }
        for (const lease of leases) {
          const run = this.#run(lease, handler, leaseMs, worker).finally(() => running.delete(run));
          running.add(run);
        }
      }
      await Promise.allSettled(running);
    } finally {
      options.signal?.removeEventListener("abort", onAbort);
    }
    if (permanent !== undefined) throw permanent;
  }

  /**
   * One lease's run; never throws (work's other runs go on): a permanent error stops work.
   * @param {Lease} lease @param {Handler} handler @param {number} leaseMs @param {Worker} worker
   */
  async #run(lease, handler, leaseMs, worker) {
    const lost = new AbortController();
    const onBroken = () => lost.abort(worker.broken.reason);
    worker.broken.addEventListener("abort", onBroken, { once: true });
    if (worker.broken.aborted) onBroken(); // an own answered after work broke: released below
    let current = lease;
    let leaseLost = false;
    // A request about this lease with no answer after a lease's length is abandoned: the
    // lease has expired meanwhile, and a server that took it and went silent must not hold
    // the run, or a stopping work(), for ever.
    const bounded = () => ({ signal: AbortSignal.timeout(leaseMs) });
    const keeper = setInterval(async () => {
      try {
        current = await this.extend(current, leaseMs, bounded());
      } catch (error) {
        if (error instanceof LeaseLost) {
          leaseLost = true;
          lost.abort(error);
        } else if (isPermanent(error)) worker.stopWith(error);
        else worker.report(error, lease); // tried again at the next tick
      }
    }, Math.max(10, Math.floor(leaseMs / 3)));
    try {
      /** @type {(() => Promise<unknown>) | undefined} */
      let outcome;
      try {
        const result = await handler(lease.task, { lease, signal: lost.signal });
        outcome = () => this.succeed(current, result ?? null, bounded());
      } catch (error) {
        outcome = () => this.fail(current, error, bounded());
      }
      // The handler is done: the lease is no longer extended, so an outcome the server
      // keeps failing to take is tried until the lease expires, and no longer.
      clearInterval(keeper);
      if (leaseLost) return;
      if (lost.signal.aborted) {
        // work stops on a permanent error and aborted the handler: the task goes back unrun
        // now, as a stopped Python worker's does, instead of waiting out its lease, whose
        // expiry would count an attempt (and could fail the task for good). A server that
        // refuses this too (the token work stopped on) leaves it to expire.
        await this.release(current, bounded()).catch(() => {});
        return;
      }
      try {
        await this.#write(outcome, () => current, worker);
      } catch (error) {
        // The result was refused (too large, not storable): the attempt fails, as it
        // would in a Python worker, with the server's reason.
        if (!(error instanceof ApiError && error.status === 422)) throw error;
        await this.#write(() => this.fail(current, error, bounded()), () => current, worker);
      }
    } catch (error) {
      if (error instanceof LeaseLost) return; // another worker has it now
      if (isPermanent(error)) worker.stopWith(error);
      else worker.report(error, lease);
    } finally {
      clearInterval(keeper);
      worker.broken.removeEventListener("abort", onBroken);
    }
  }

  /**
   * An outcome's write, tried again after a transient error (reported each time) until the
   * lease has expired, when the server would refuse it anyway.
   * @param {() => Promise<unknown>} write @param {() => Lease} lease @param {Worker} worker
   */
  async #write(write, lease, worker) {
    for (let failures = 1; ; failures += 1) {
      try {
        return await write();
      } catch (error) {
        if (error instanceof ApiError && error.status < 500) throw error;
        const expires = Date.parse(lease().expires_at ?? "");
        if (!(Date.now() < expires)) throw error;
        worker.report(error, lease());
        await sleep(Math.min(backoff(failures), Math.max(0, expires - Date.now())), worker.broken);
        if (worker.broken.aborted) throw error;
      }
    }
  }
}

/**
 * What `work` shares with each run.
 * @typedef {{report: (error: unknown, lease: Lease | null) => void,
 *   stopWith: (error: unknown) => void, broken: AbortSignal}} Worker
 */

/**
 * An error that retrying cannot mend: the server refused the token (401), the Origin (403)
 * or the Host (400), has no such route (404, other than a task not found), or refused the
 * body (422). Anything else (no answer, 5xx, 408, 429) may pass.
 * @param {unknown} error @returns {boolean}
 */
export function isPermanent(error) {
  if (!(error instanceof ApiError) || error instanceof LeaseLost) return false;
  const { status, code } = error;
  return [400, 401, 403, 422].includes(status) || (status === 404 && code !== "not_found");
}

/**
 * A key or name as one segment of a path, `/` and `%` included. fetch resolves a segment "."
 * or ".." (percent-encoded too) as a URL's dot segment, which would name another route (the
 * task list, another key's wait): such a key is refused here, before any request.
 * @param {string} text @returns {string}
 */
export function segment(text) {
  if (text === "." || text === "..") {
    throw new TypeError(`key: ${JSON.stringify(text)} cannot be named in a URL path by fetch`);
  }
  return encodeURIComponent(text);
}

/** @param {string} text @returns {any} its JSON, or null if it is none */
function parsed(text) {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

/** Milliseconds to wait after the nth failure in a row: doubling from 100 ms to 5 s, jittered. */
const backoff = (/** @type {number} */ failures) =>
  Math.min(5_000, 100 * 2 ** Math.min(failures - 1, 6)) * (0.5 + Math.random() / 2);

/** @param {AbortSignal} signal @returns {Promise<void>} resolves once it aborts */
const aborted = (signal) =>
  new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener("abort", () => resolve(), { once: true });
  });
