// herald-resolve: herald.ingested -> herald.resolved, one record per recipient (keyed by recipient user id),
// with each recipient's devices, presence, preferences and unread counts from Redis (pipelined per batch).
import Foundation
import HeraldConfig
import HeraldPipeline
import HeraldRedis
import HeraldStage

let setup = await StageSetup.startOrExit(.resolve)
let redis = setup.redisOrExit()
let topics = setup.pipeline.kafka.topics
let logger = setup.logger
let metrics = setup.context.metrics
let processor = ResolveProcessor(
    resolvedTopic: topics.resolved, state: RedisStateReader(store: StateStore(connection: redis, logger: logger)),
    onTransientFailure: { failure in
        metrics.redisError(code: "transient")
        logger.warning("redis unavailable; retrying the batch", metadata: ["error": "\(failure)"])
    })
exit(await setup.run(processor: processor, topics: [topics.ingested], explain: setup.explainSink(redis)))
