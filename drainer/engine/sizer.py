"""How much a drain claims next (`Sizer`), from what its batches have shown."""

import math

MAX_INT = 2**63 - 1  # PostgreSQL's bigint: job ids, a claim's LIMIT



class Sizer:
    """How many jobs to claim next.

    Adaptive unless pinned: it starts at one round of handlers (START at least),
    doubles while full batches finish well within TARGET seconds (fast handlers, deep
    queue: fewer round trips per job) and halves when a batch runs long (slow
    handlers: leave the rest to other drainers), but never below two rounds of
    handlers when there are several (fewer would leave slots idle, and a batch of one
    round is not refilled: every batch would wait for its slowest job). It never
    exceeds MAX, or two rounds when that is more, so a batch can always be refilled.
    Near the deadline it claims only what the observed handler time says can finish.
    """

    START, MIN, MAX = 10, 1, 500
    TARGET = 0.25  # seconds of work per batch

    def __init__(self, pinned: int | None = None, concurrency: int = 1):
        self.pinned = pinned
        self.concurrency = concurrency
        self.most = min(max(self.MAX, 2 * concurrency), MAX_INT)
        self.least = self.MIN if concurrency == 1 else min(2 * concurrency, MAX_INT)
        self.size = pinned or min(self.most, max(self.START, concurrency))
        self.per_job: float | None = None  # observed wall seconds per job, smoothed
        self.longest: dict[str, float] = {}  # queue -> the longest handler run seen
        self.trip: float | None = None  # a write-back's and claim's round trip, smoothed

    def took(self, queue: str, seconds: float) -> None:
        """Learn how long one of `queue`'s handlers ran (as soon as it ends)."""
        self.longest[queue] = max(seconds, self.longest.get(queue, 0.0))

    def observe(self, jobs: int, wall: float, full: bool) -> None:
        """Learn from a finished batch of `jobs` that took `wall` seconds."""
        if not jobs:
            return
        per_job = wall / jobs
        self.per_job = per_job if self.per_job is None else 0.7 * self.per_job + 0.3 * per_job
        if self.pinned:
            return
        if wall > 2 * self.TARGET:
            self.size = max(self.least, self.size // 2)
        elif full and wall < self.TARGET / 2:
            self.size = min(self.most, self.size * 2)

    def tripped(self, seconds: float) -> None:
        """Learn how long a write-back with the next claim took, answer read."""
        self.trip = seconds if self.trip is None else 0.7 * self.trip + 0.3 * seconds

    def lead(self) -> int:
        """How many jobs still to start a refill is asked for and sent at most: as
        many as the drain runs in two round trips, by the write-backs' round trips
        and the wall time per job seen so far (twice: both vary, and a drain bound by
        the database runs a claim's jobs in about one round trip); no more than a
        claim holds; and 0 unless that is more than two rounds of handlers (a refill
        then goes as the last round starts, as for slow handlers). The database works
        on the next claim while the handlers run: for handlers of microseconds, a
        batch's round trip took longer than its handlers, one after the other. The
        time per job is the batches' own, so jobs that turn slow shrink the lead
        within a refill or two."""
        if self.trip is None or not self.per_job:
            return 0
        ahead = min(self.size, math.ceil(2 * self.trip / self.per_job))
        return ahead if ahead > 2 * self.concurrency else 0

    def fits(self, remaining: float | None, ahead: int = 0) -> int:
        """The next claim's size, 0 when no job could finish in `remaining` seconds;
        `ahead`: jobs already held that run first (a refill's batch still runs)."""
        if remaining is None:
            return self.size
        if self.per_job is not None:
            remaining -= ahead * self.per_job
        if remaining <= 0:
            return 0
        if self.per_job is None:
            return min(self.size, self.concurrency)  # nothing observed yet: one round
        return min(self.size, math.floor(remaining / max(self.per_job, 1e-6)))

    def may_start(self, remaining: float | None, queue: str | None = None,
                  timeout: float | None = None) -> bool:
        """Whether a job of `queue` can finish in `remaining` seconds, judged from the
        longest that queue's handlers have run (a mean would start a slow job after
        fast ones with too little time left), and never longer than the task's
        `timeout`; from the mean of every job when none of the queue has run yet."""
        if remaining is None:
            return True
        longest = self.longest.get(queue) if queue is not None else None
        if longest is None:
            longest = timeout if timeout is not None else self.per_job or 0.0
        elif timeout is not None:
            longest = min(longest, timeout)
        return remaining > longest

    def refills(self, size: int, claimed: int, *, limited: bool,
                refilling: bool = False) -> bool:
        """Whether a batch from a claim of `size` that took `claimed` jobs is refilled:
        when the claim came back full (more are likely ready) and holds two rounds of
        handlers or more. A smaller one is written back between batches, as a claim
        while its few handlers run would hold the next jobs' leases for no gain. A
        drain with limited queues, whose claims never take more jobs than free slots,
        is refilled once its claim took any, even by refills that take none (the next
        then waits for a result to write back, Batch): each refill waits for a quarter of
        the slots to be free (Batch's refill_at), so the slots do not wait for the
        batch's slowest job, whatever the time per job seen so far: once the refills of
        fast jobs are quick, that time says nothing of a slow one holding a slot. Any
        other batch is asked to refill as its last rounds start, or earlier by the
        lead (see `lead`), so its next jobs come as these run out."""
        if limited:
            # Even when this claim took none: the batch's jobs that finish later must be
            # written back as they do (Batch waits for one before the next refill), or
            # each would hold its limit's place, and its group's next job, until the
            # batch's slowest job ends.
            return size > 0 and (claimed > 0 or refilling)
        rounds = 2 * self.concurrency
        return size > 0 and claimed == size and size >= rounds
