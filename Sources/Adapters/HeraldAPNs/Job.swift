import Foundation
import HeraldCore

/// One accepted request and its per-attempt state. Created by a caller, handed to the I/O
/// loop through the locked inbox, and from then on touched only by the I/O thread.
final class Job: @unchecked Sendable {
    // @unchecked Sendable: ownership moves from the submitting task to the I/O thread through
    // the loop's lock-protected inbox; after that only the I/O thread reads or writes it.
    let request: APNsDelivery
    let completion: @Sendable (APNsResponse) -> Void
    /// Counted attempts so far (answers and in-flight losses; transparent resends do not count).
    var attempts = 0
    var completed = false
    var notBefore: ContinuousClock.Instant = .now
    let path: [UInt8]

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

    init(request: APNsDelivery, completion: @escaping @Sendable (APNsResponse) -> Void) {
        self.request = request
        self.completion = completion
        var p = Array("/3/device/".utf8)
        p.append(contentsOf: request.deviceToken.utf8)
        self.path = p
    }

    /// A request to another path than APNs's `/3/device/<token>` (FCM's `messages:send`).
    init(request: APNsDelivery, path: [UInt8], completion: @escaping @Sendable (APNsResponse) -> Void) {
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
    private var items: [Job?] = []
    private var head = 0
    private var front: [Job] = []
    private var urgent: [Job?] = []
    private var urgentHead = 0

    var count: Int { items.count - head + front.count + urgent.count - urgentHead }
    var isEmpty: Bool { count == 0 }

    mutating func append(_ job: Job) {
        if job.request.prioritized { urgent.append(job) } else { items.append(job) }
    }
    mutating func pushFront(_ job: Job) { front.append(job) }

    /// True when the next `popFirst` gives a prioritized job; nil when empty.
    var nextIsPrioritized: Bool? {
        if let job = front.last { return job.request.prioritized }
        if urgentHead < urgent.count { return true }
        return head < items.count ? false : nil
    }

    mutating func popFirst() -> Job? {
        if let job = front.popLast() { return job }
        if urgentHead < urgent.count {
            let job = urgent[urgentHead]
            urgent[urgentHead] = nil
            urgentHead += 1
            if urgentHead == urgent.count { urgent.removeAll(keepingCapacity: true); urgentHead = 0 }
            return job
        }
        guard head < items.count else { return nil }
        let job = items[head]
        items[head] = nil
        head += 1
        if head > 4096 && head * 2 > items.count {
            items.removeFirst(head)
            head = 0
        }
        return job
    }

    /// Removes and returns every job for which `expired` is true.
    mutating func removeAll(where expired: (Job) -> Bool) -> [Job] {
        var out: [Job] = []
        var keptFront: [Job] = []
        for job in front { if expired(job) { out.append(job) } else { keptFront.append(job) } }
        front = keptFront
        var keptUrgent: [Job?] = []
        for i in urgentHead..<urgent.count {
            if let job = urgent[i] {
                if expired(job) { out.append(job) } else { keptUrgent.append(job) }
            }
        }
        urgent = keptUrgent
        urgentHead = 0
        var kept: [Job?] = []
        kept.reserveCapacity(items.count - head)
        for i in head..<items.count {
            if let job = items[i] {
                if expired(job) { out.append(job) } else { kept.append(job) }
            }
        }
        items = kept
        head = 0
        return out
    }
}
