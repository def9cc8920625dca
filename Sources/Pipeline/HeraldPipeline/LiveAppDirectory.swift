import HeraldCore
import Synchronization

/// The app directory a running stage renders with, replaceable while it runs (the pipeline file reloaded on
/// SIGHUP or when it changes, docs/operations.md "Reloading"). Readers take the current directory once per batch,
/// so a batch is rendered with one configuration from start to end.
public final class LiveAppDirectory: Sendable {
    private let state: Mutex<(directory: AppDirectory, generation: Int)>

    public init(_ directory: AppDirectory) {
        state = Mutex((directory, 1))
    }

    /// The directory now.
    public var current: AppDirectory { state.withLock { $0.directory } }

    /// How many directories this one has held (1 at start, +1 per `replace`).
    public var generation: Int { state.withLock { $0.generation } }

    /// Swaps in a new directory; batches already running finish with the one they took.
    public func replace(with directory: AppDirectory) {
        state.withLock {
            $0.directory = directory
            $0.generation += 1
        }
    }
}
