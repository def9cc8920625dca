import Foundation
import HeraldConfig
import Logging
import Metrics
import ServiceLifecycle
import UnixSignals

/// Reloads the pipeline file on SIGHUP and when its content changes (docs/operations.md "Reloading"), and hands
/// a file that reads without error to `apply`. A file that does not read (bad YAML, a wrong value), or that `apply`
/// refuses (send: a credential that does not load), is refused: the error is logged with the key path, `herald_config_reloads_total{outcome="refused"}` counts it, and the running
/// configuration stays. Changes outside `apps:` (Kafka, Redis, stages, api) take effect at the next start only.
public final class PipelineReloader: Service, Sendable {
    let path: String
    let environment: [String: String]
    let interval: Duration?
    let apply: @Sendable (PipelineConfig) throws -> Void
    let logger: Logger
    let stage: String

    public init(
        path: String, environment: [String: String], interval: Duration?, stage: String,
        logger: Logger, apply: @escaping @Sendable (PipelineConfig) throws -> Void
    ) {
        self.path = path
        self.environment = environment
        self.interval = interval
        self.stage = stage
        self.logger = logger
        self.apply = apply
    }

    /// A reloader for a stage, from its setup: the file it started from, the watch interval from the environment.
    public static func forStage(
        _ setup: StageSetup, apply: @escaping @Sendable (PipelineConfig) throws -> Void
    ) throws -> PipelineReloader {
        let path = try setup.config.text(.pipeline) ?? ConfigKey.pipeline.defaultValue ?? ""
        let ms = try setup.config.requiredInt(.pipelineWatchMs)
        let interval: Duration? = ms == 0 ? nil : .milliseconds(ms)
        return PipelineReloader(
            path: path, environment: ProcessInfo.processInfo.environment, interval: interval,
            stage: setup.stage.rawValue, logger: setup.logger, apply: apply)
    }

    /// `forStage`, or the end of the process (status 2, the error on stderr) when its settings do not read.
    public static func forStageOrExit(
        _ setup: StageSetup, apply: @escaping @Sendable (PipelineConfig) throws -> Void
    ) -> PipelineReloader {
        do {
            return try forStage(setup, apply: apply)
        } catch {
            FileHandle.standardError.write(Data("herald-\(setup.stage.rawValue): \(error)\n".utf8))
            exit(2)
        }
    }

    public func run() async throws {
        let signals = await UnixSignalsSequence(trapping: .sighup)
        let first = try? Data(contentsOf: URL(fileURLWithPath: path))
        // Graceful shutdown cancels the watch (the signal sequence ends, the poll stops).
        await cancelWhenGracefulShutdown {
            await withTaskGroup(of: Void.self) { group in
                group.addTask {
                    for await _ in signals {
                        self.reload(reason: "SIGHUP")
                    }
                }
                if let interval = self.interval {
                    group.addTask {
                        // Polls the content (the file is small): editors and deploy tools replace the file by a
                        // rename, which a watch on the old inode would miss.
                        var last = first
                        while !Task.isCancelled {
                            try? await Task.sleep(for: interval)
                            let now = try? Data(contentsOf: URL(fileURLWithPath: self.path))
                            if let now, now != last {
                                last = now
                                self.reload(reason: "file changed")
                            }
                        }
                    }
                }
                await group.waitForAll()
            }
        }
    }

    /// Reads the file and applies it, or refuses it; returns whether it was applied.
    @discardableResult
    public func reload(reason: String) -> Bool {
        do {
            let loaded = try PipelineLoader.load(path: path)
            for warning in loaded.warnings {
                logger.warning("pipeline file: \(warning)", metadata: ["file": "\(path)"])
            }
            try apply(try loaded.config.applying(ConfigReader(environment)))
            Counter(label: StageMetrics.Name.configReloads, dimensions: [("stage", stage), ("outcome", "applied")])
                .increment()
            logger.info(
                "pipeline file reloaded: apps replaced",
                metadata: [
                    "file": "\(path)", "reason": "\(reason)", "apps": "\(loaded.config.apps.apps.count)",
                ])
            return true
        } catch {
            Counter(label: StageMetrics.Name.configReloads, dimensions: [("stage", stage), ("outcome", "refused")])
                .increment()
            logger.error(
                "pipeline file refused; the running configuration stays",
                metadata: [
                    "file": "\(path)", "reason": "\(reason)", "error": "\(error)",
                ])
            return false
        }
    }
}
