import DequeModule
import Foundation
import HeraldCore

/// One accepted request and its per-attempt state. Created by a caller, handed to the I/O
/// loop through the locked inbox, and from then on touched only by the I/O thread.
final class Job: @unchecked Sendable {
    // @unchecked Sendable: ownership moves from the submitting task to the I/O thread through
    // the loop's lock-protected inbox; after that only the I/O thread reads or writes it.
    let request: PushDelivery
    let completion: @Sendable (PushResponse) -> Void
    /// Counted attempts so far (answers and in-flight losses; transparent resends do not count).
    var attempts = 0
    var completed = false
    /// When a scheduled retry may be sent (set with the retry; nil before any).
    var notBefore: ContinuousClock.Instant?
    /// The request path when it is not APNs's `/3/device/<token>` (FCM's `messages:send`); nil for APNs, whose path
    /// is written from the token straight into the header block.
    let path: [UInt8]?

    // Per attempt
    var headersSent = false
    var bodyOffset = 0
    var status: Int?
    var answeredAPNsID: String?
    var body: [UInt8] = []
    var bearerIssuedAt: Date?
    /// The `retry-after` header of the answer (FCM).
    var retryAfter: String?
    /// The access token was renewed once for this request after a 401 (FCM).
    var renewedCredentials = false
    /// The retries of a traced request (`PushResponse.retries`); never appended to for the others.
    var retries: [ProviderRetry] = []

    /// Notes a retry of a traced request (nothing for the others): now, and the answer that caused it.
    func noteRetry(status: Int?, reason: String) {
        guard request.traced else { return }
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        retries.append(
            ProviderRetry(
                timeNanoseconds: UInt64(max(0, time.tv_sec)) &* 1_000_000_000 &+ UInt64(max(0, time.tv_nsec)),
                status: status, reason: reason))
    }

    init(request: PushDelivery, path: [UInt8]? = nil, completion: @escaping @Sendable (PushResponse) -> Void) {
        self.request = request
        self.completion = completion
        self.path = path
    }

    func resetAttempt() {
        headersSent = false
        bodyOffset = 0
        status = nil
        answeredAPNsID = nil
        body.removeAll(keepingCapacity: false)
        bearerIssuedAt = nil
        retryAfter = nil
    }
}

/// A FIFO of jobs with cheap push-front (resends go first); prioritized jobs go before the others.
struct JobQueue {
    private var items: Deque<Job> = []
    private var urgent: Deque<Job> = []
    /// Resends, kept as a stack: the last job pushed to the front is the next one sent.
    private var front: [Job] = []

    var count: Int { items.count + front.count + urgent.count }
    var isEmpty: Bool { count == 0 }

    mutating func append(_ job: Job) {
        if job.request.prioritized { urgent.append(job) } else { items.append(job) }
    }
    mutating func pushFront(_ job: Job) { front.append(job) }

    /// True when the next `popFirst` gives a prioritized job; nil when empty.
    var nextIsPrioritized: Bool? {
        if let job = front.last { return job.request.prioritized }
        if !urgent.isEmpty { return true }
        return items.isEmpty ? nil : false
    }

    mutating func popFirst() -> Job? {
        if let job = front.popLast() { return job }
        if let job = urgent.popFirst() { return job }
        return items.popFirst()
    }

    /// The earliest deadline of the queued jobs; nil when empty.
    var earliestDeadline: ContinuousClock.Instant? {
        var earliest: ContinuousClock.Instant?
        for queue in [items, urgent] {
            for job in queue where earliest.map({ job.request.deadline < $0 }) ?? true {
                earliest = job.request.deadline
            }
        }
        for job in front where earliest.map({ job.request.deadline < $0 }) ?? true { earliest = job.request.deadline }
        return earliest
    }

    /// Removes and returns every job for which `expired` is true.
    mutating func removeAll(where expired: (Job) -> Bool) -> [Job] {
        var out: [Job] = []
        var keptFront: [Job] = []
        for job in front { if expired(job) { out.append(job) } else { keptFront.append(job) } }
        front = keptFront
        urgent = Self.split(urgent, into: &out, where: expired)
        items = Self.split(items, into: &out, where: expired)
        return out
    }

    /// The jobs of `queue` for which `expired` is false, in order; the others are appended to `out`.
    private static func split(_ queue: Deque<Job>, into out: inout [Job], where expired: (Job) -> Bool) -> Deque<Job> {
        var kept: Deque<Job> = []
        kept.reserveCapacity(queue.count)
        for job in queue { if expired(job) { out.append(job) } else { kept.append(job) } }
        return kept
    }
}
