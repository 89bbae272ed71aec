"""Where one collection on one replica set saturates: N consumers, M tasks/s, a server of
given write capacity. A discrete-event simulation of the consumer's round trips.

Nothing here talks to MongoDB: the model replays what the benchmarks measure a consumer
sending (bench/README.md), in simulated time, against a server that completes ``capacity``
single-document writes per second (a FIFO queue, one at a time, plus a network round trip):

- a publish is one write (``find_one_and_update`` upsert); the task is then due, and the
  consumers' change streams wake them;
- a consumer with free slots claims: one due task is one ``find_one_and_update``; more than
  one (up to its free slots) is three round trips (the best candidates, one bulk write of
  fenced claims, a read of what it won); the consumers of one process take turns at
  claiming, those of different processes claim at once (``--per-process``; a claim that
  loses a race to another process is not modelled: each takes distinct due tasks);
- a finish is one write; finishes that end while one is in flight wait for it and go out
  together (one bulk write and one read);
- every ``ping_interval`` a consumer with running tasks pings them all in one bulk write;
  idle, it makes four reads a minute (schedules, limits, expired tasks).

A bulk write of ``n`` documents costs the server ``1 + (n - 1) * batch_doc_cost`` writes: with
majority write concern most of a write's cost is the replication wait, which a batch shares.
That factor is an assumption (``--batch-doc-cost``); the default 0.25 is conservative beside
the benchmarks' wire runs, where a bulk write of 16 took about twice a single one.

Calibration: the round trips per task it prints at low load (2: claim and finish) and at
saturation (0.3 to 0.4) match bench_throughput.py's (2.01; 0.25 on memory://, 0.38 on the
wire at 3 x 16).

    python bench/simulate_capacity.py                       # the table in docs/scaling.md
    python bench/simulate_capacity.py --capacity 10000 --consumers 4 16 64
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import heapq
import itertools
import random
from collections.abc import Callable

IDLE_READS_PER_S = 4 / 60


@dataclasses.dataclass
class Model:
    capacity: float = 2_500.0  # single-document majority writes per second the server completes
    rtt_s: float = 0.001  # network round trip between a consumer and the primary
    consumers: int = 4
    per_process: int = 1  # consumers per process: they take turns at claiming
    max_running: int = 16
    handler_s: float = 0.05  # how long a handler runs
    ping_interval_s: float = 30.0
    batch_doc_cost: float = 0.25
    seconds: float = 6.0  # simulated time; the first third is warm-up, not measured
    seed: int = 7


@dataclasses.dataclass
class Outcome:
    offered: float  # tasks/s published
    done: float  # tasks/s finished in the measured window
    server_busy: float  # fraction of the window the server was writing
    calls_per_task: float  # consumer round trips per task (not counting the publish)
    writes_per_s: float  # the server's load, in single-document writes per second
    p99_start_s: float  # publish to handler start
    backlog: int  # tasks due but not claimed at the end

    @property
    def keeps_up(self) -> bool:
        """Tasks start within a second, and no more than a quarter second of arrivals wait
        unclaimed at the end (past saturation the backlog grows without bound)."""
        return self.p99_start_s < 1.0 and self.backlog <= 0.25 * self.offered


class Simulation:
    def __init__(self, model: Model, rate: float) -> None:
        self.m = model
        self.rate = rate
        self.now = 0.0
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.order = itertools.count()
        self.random = random.Random(model.seed)
        self.server_free_at = 0.0
        self.server_busy = 0.0
        self.writes = 0.0
        self.calls = 0
        self.due: collections.deque[float] = collections.deque()  # publish times
        self.starts: list[float] = []
        self.finished = 0
        self.claiming: set[int] = set()  # processes with a claim in flight (one each)
        self.consumers = [Consumer(self, n) for n in range(model.consumers)]
        self.measure_from = model.seconds / 3

    # -- the event loop

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (when, next(self.order), action))

    def request(self, cost: float, then: Callable[[], None], consumer: bool = True) -> None:
        """One round trip: half the network, the server's FIFO queue, the other half."""
        arrive = self.now + self.m.rtt_s / 2
        start = max(arrive, self.server_free_at)
        service = cost / self.m.capacity
        self.server_free_at = start + service
        if self.measure_from <= start < self.m.seconds:  # the part inside the window
            self.server_busy += min(self.server_free_at, self.m.seconds) - start
            self.writes += cost
            self.calls += consumer
        self.at(self.server_free_at + self.m.rtt_s / 2, then)

    def run(self) -> Outcome:
        self.at(self.random.expovariate(self.rate), self.publish)
        for consumer in self.consumers:
            self.at(
                self.m.ping_interval_s * (consumer.index + 1) / len(self.consumers), consumer.ping
            )
            self.at(self.random.uniform(0, 1 / IDLE_READS_PER_S), consumer.idle_read)
        while self.events:
            when, _, action = heapq.heappop(self.events)
            if when > self.m.seconds:
                break
            self.now = when
            action()
        window = self.m.seconds - self.measure_from
        measured = [s for s in self.starts if s >= 0]
        measured.sort()
        p99 = measured[int(len(measured) * 0.99)] if measured else float("inf")
        return Outcome(
            offered=self.rate,
            done=self.finished / window,
            server_busy=self.server_busy / window,
            calls_per_task=self.calls / max(self.finished, 1),
            writes_per_s=self.writes / window,
            p99_start_s=p99,
            backlog=len(self.due),
        )

    # -- the publisher and the wake-ups

    def publish(self) -> None:
        published_at = self.now

        def written() -> None:
            self.due.append(published_at)
            self.wake()

        self.request(1.0, written, consumer=False)
        self.at(self.now + self.random.expovariate(self.rate), self.publish)

    def wake(self) -> None:
        """Due tasks wake the consumers (their change streams): each process without a claim
        in flight sends one, from a consumer of it with free slots."""
        start = self.random.randrange(len(self.consumers))
        for n in range(len(self.consumers)):
            if not self.due:
                return
            consumer = self.consumers[(start + n) % len(self.consumers)]
            if consumer.process not in self.claiming and consumer.free > 0:
                consumer.claim()


class Consumer:
    def __init__(self, sim: Simulation, index: int) -> None:
        self.sim = sim
        self.index = index
        self.process = index // sim.m.per_process
        self.running = 0
        self.claimed = 0  # slots reserved by a claim in flight
        self.finishing = False
        self.waiting_finishes = 0

    @property
    def free(self) -> int:
        return self.sim.m.max_running - self.running - self.claimed

    def claim(self) -> None:
        sim = self.sim
        count = min(self.free, len(sim.due))
        published = [sim.due.popleft() for _ in range(count)]
        self.claimed += count
        sim.claiming.add(self.process)

        def won() -> None:
            self.claimed -= count
            self.running += count
            sim.claiming.discard(self.process)
            for published_at in published:
                if published_at >= sim.measure_from:
                    sim.starts.append(sim.now - published_at)
                sim.at(sim.now + sim.m.handler_s, self.finish)
            sim.wake()

        if count == 1:
            sim.request(1.0, won)
        else:  # candidates, the bulk write of fenced claims, the read of what it won
            bulk = 1 + (count - 1) * sim.m.batch_doc_cost
            sim.request(1.0, lambda: sim.request(bulk, lambda: sim.request(1.0, won)))

    def finish(self) -> None:
        if self.finishing:
            self.waiting_finishes += 1
            return
        self.finishing = True
        self.sim.request(1.0, lambda: self.finished(1))

    def finished(self, count: int) -> None:
        sim = self.sim
        self.running -= count
        if sim.now >= sim.measure_from:
            sim.finished += count
        if self.waiting_finishes:
            batch, self.waiting_finishes = self.waiting_finishes, 0
            bulk = 1 + (batch - 1) * sim.m.batch_doc_cost
            sim.request(bulk, lambda: sim.request(1.0, lambda: self.finished(batch)))
        else:
            self.finishing = False
        sim.wake()

    def ping(self) -> None:
        sim = self.sim
        if self.running:
            sim.request(1 + (self.running - 1) * sim.m.batch_doc_cost, lambda: None)
        sim.at(sim.now + sim.m.ping_interval_s, self.ping)

    def idle_read(self) -> None:
        self.sim.request(1.0, lambda: None)
        self.sim.at(self.sim.now + 1 / IDLE_READS_PER_S, self.idle_read)


def simulate(model: Model, rate: float) -> Outcome:
    return Simulation(model, rate).run()


def saturation(model: Model) -> tuple[float, Outcome]:
    """The highest publish rate the model keeps up with (bisection on tasks/s)."""
    workers_bound = model.consumers * model.max_running / model.handler_s
    low, high = 1.0, min(model.capacity * 2, workers_bound * 1.2)
    best = simulate(model, low)
    for _ in range(9):
        middle = (low + high) / 2
        outcome = simulate(model, middle)
        if outcome.keeps_up:
            low, best = middle, outcome
        else:
            high = middle
    return low, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--capacity", type=float, default=2_500.0, help="writes/s the server completes"
    )
    parser.add_argument("--consumers", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--max-running", type=int, default=16)
    parser.add_argument("--per-process", type=int, default=1, help="consumers per process")
    parser.add_argument("--handler-ms", type=float, default=50.0)
    parser.add_argument("--rtt-ms", type=float, default=1.0)
    parser.add_argument("--batch-doc-cost", type=float, default=0.25)
    parser.add_argument(
        "--rates", type=float, nargs="*", default=[], help="also simulate these tasks/s"
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="simulated time per point")
    args = parser.parse_args()

    def model(consumers: int) -> Model:
        return Model(
            capacity=args.capacity,
            rtt_s=args.rtt_ms / 1000,
            consumers=consumers,
            per_process=args.per_process,
            max_running=args.max_running,
            handler_s=args.handler_ms / 1000,
            batch_doc_cost=args.batch_doc_cost,
            seconds=args.seconds,
        )

    print(
        f"server: {args.capacity:,.0f} single-document writes/s; round trip {args.rtt_ms} ms; "
        f"handlers of {args.handler_ms} ms, max_running {args.max_running}, "
        f"{args.per_process} consumer(s) per process; a bulk write of n "
        f"costs 1 + (n - 1) x {args.batch_doc_cost}"
    )
    print()
    print(
        "| consumers | saturates at (tasks/s) | workers could run | server busy | "
        "round trips/task | writes/s | p99 publish to start |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for consumers in args.consumers:
        m = model(consumers)
        rate, outcome = saturation(m)
        workers = consumers * m.max_running / m.handler_s
        print(
            f"| {consumers} | {rate:,.0f} | {workers:,.0f} | {outcome.server_busy:.0%} | "
            f"{outcome.calls_per_task:.2f} | {outcome.writes_per_s:,.0f} | "
            f"{outcome.p99_start_s * 1000:.0f} ms |"
        )
    if args.rates:
        print()
        print(
            "| consumers | tasks/s offered | done | server busy | round trips/task | "
            "backlog | p99 publish to start |"
        )
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for consumers in args.consumers:
            for rate in args.rates:
                o = simulate(model(consumers), rate)
                print(
                    f"| {consumers} | {rate:,.0f} | {o.done:,.0f} | {o.server_busy:.0%} | "
                    f"{o.calls_per_task:.2f} | {o.backlog:,} | {o.p99_start_s * 1000:.0f} ms |"
                )


if __name__ == "__main__":
    main()
