// Writes one JSON line per answered request to a file, on a thread of its own.
// The loop thread formats lines into a local buffer and hands it over once per loop pass;
// the writer thread writes at least every 100 ms and on close.
import Glibc

/// @unchecked Sendable: `shared`, `closing` and `failed` are only touched with `mutex` held;
/// `file` is used only by the writer thread (and by `close()` after the thread has been joined).
final class Recorder: @unchecked Sendable {
    private var mutex = pthread_mutex_t()
    private var cond = pthread_cond_t()
    private var shared: [UInt8] = []
    private var closing = false
    private let file: UnsafeMutablePointer<FILE>
    private var thread: pthread_t?
    let path: String

    init(path: String) throws {
        guard let f = fopen(path, "w") else {
            throw MockSetupError("cannot open --record file \(path): \(String(cString: strerror(errno)))")
        }
        self.path = path
        file = f
        pthread_mutex_init(&mutex, nil)
        pthread_cond_init(&cond, nil)
        shared.reserveCapacity(1 << 20)
        thread = startThread { [self] in self.writerLoop() }
    }

    deinit {
        close()
        pthread_mutex_destroy(&mutex)
        pthread_cond_destroy(&cond)
    }

    /// Takes the bytes of `buffer` (complete lines), leaving it empty with its capacity.
    func submit(_ buffer: inout [UInt8]) {
        guard !buffer.isEmpty else { return }
        pthread_mutex_lock(&mutex)
        shared.append(contentsOf: buffer)
        let wake = shared.count > (1 << 20)
        pthread_mutex_unlock(&mutex)
        if wake { pthread_cond_signal(&cond) }
        buffer.removeAll(keepingCapacity: true)
    }

    /// Writes everything submitted so far and stops the writer thread. Idempotent.
    func close() {
        pthread_mutex_lock(&mutex)
        let alreadyClosed = closing
        closing = true
        pthread_mutex_unlock(&mutex)
        pthread_cond_signal(&cond)
        if !alreadyClosed, let t = thread {
            pthread_join(t, nil)
            thread = nil
            fclose(file)
        }
    }

    private func writerLoop() {
        var local: [UInt8] = []
        local.reserveCapacity(1 << 20)
        while true {
            pthread_mutex_lock(&mutex)
            if shared.isEmpty && !closing {
                var ts = timespec()
                clock_gettime(CLOCK_REALTIME, &ts)
                ts.tv_nsec += 100_000_000
                if ts.tv_nsec >= 1_000_000_000 { ts.tv_sec += 1; ts.tv_nsec -= 1_000_000_000 }
                pthread_cond_timedwait(&cond, &mutex, &ts)
            }
            swap(&local, &shared)
            let done = closing
            pthread_mutex_unlock(&mutex)
            if !local.isEmpty {
                local.withUnsafeBytes { _ = fwrite($0.baseAddress, 1, $0.count, file) }
                fflush(file)
                local.removeAll(keepingCapacity: true)
            }
            if done {
                pthread_mutex_lock(&mutex)
                let empty = shared.isEmpty
                pthread_mutex_unlock(&mutex)
                if empty { return }
            }
        }
    }
}

/// Starts a detached-joinable POSIX thread running `body`.
func startThread(_ body: @escaping @Sendable () -> Void) -> pthread_t? {
    let context = Unmanaged.passRetained(ThreadBody(body)).toOpaque()
    var t = pthread_t()
    let rc = pthread_create(
        &t, nil,
        { raw in
            guard let raw else { return nil }
            Unmanaged<ThreadBody>.fromOpaque(raw).takeRetainedValue().body()
            return nil
        }, context)
    if rc != 0 {
        Unmanaged<ThreadBody>.fromOpaque(context).release()
        return nil
    }
    return t
}

private final class ThreadBody {
    let body: @Sendable () -> Void
    init(_ body: @escaping @Sendable () -> Void) { self.body = body }
}
