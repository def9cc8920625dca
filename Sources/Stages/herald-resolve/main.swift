// herald-resolve: herald.ingested -> herald.resolved, one record per recipient (keyed by recipient user id),
// with each recipient's devices, presence, preferences and unread counts from Redis (pipelined per batch).
import Foundation
import HeraldConfig
import HeraldCore
import HeraldPipeline
import HeraldRedis
import HeraldStage

let setup = await StageSetup.startOrExit(.resolve)
let redis = setup.redisOrExit()
let topics = setup.pipeline.kafka.topics
let logger = setup.logger
let metrics = setup.context.metrics
// The priority lane has a Redis connection of its own: its reads never queue behind a bulk batch's.
let priorityRedis = setup.redisOrExit()
// The apps (known ids, priority policies, counting) are reloaded from the pipeline file on SIGHUP and when it changes.
let apps = LiveAppDirectory(setup.pipeline.apps)
let reloader = PipelineReloader.forStageOrExit(setup) { config in apps.replace(with: config.apps) }
func reader(_ lane: Lane) -> RedisStateReader {
    RedisStateReader(store: StateStore(connection: lane == .priority ? priorityRedis : redis, logger: logger))
}
// One loop per lane (herald.ingested.priority -> herald.resolved.priority, herald.ingested -> herald.resolved).
let lanes = Lane.allCases.map { lane in
    StageLane(
        lane, topics: [topics.ingested(lane)],
        processor: live(
            ResolveProcessor(
                resolvedTopic: topics.resolved(lane), state: reader(lane),
                lanes: (priority: topics.resolvedPriority, bulk: topics.resolved, apps: setup.pipeline.apps),
                // Herald-kept unread and mention counts for the apps with `counts: true` (docs/behaviour.md §12).
                counting: ResolveCounting(
                    counter: RedisMessageCounter(
                        store: StateStore(connection: lane == .priority ? priorityRedis : redis, logger: logger),
                        markerTTLMilliseconds: Int64(setup.pipeline.redis.idempotencyTTLSeconds) * 1000),
                    apps: setup.pipeline.apps),
                progress: RedisFanOutProgress(connection: lane == .priority ? priorityRedis : redis),
                onTransientFailure: { failure in
                    metrics.redisError(code: "transient")
                    logger.warning("redis unavailable; retrying the batch", metadata: ["error": "\(failure)"])
                })))
}
func live(_ processor: ResolveProcessor) -> ResolveProcessor {
    var processor = processor
    processor.live = apps
    return processor
}
StageProcess.exit(await setup.run(lanes: lanes, explain: setup.bestEffortExplainSink(), before: [reloader]))
