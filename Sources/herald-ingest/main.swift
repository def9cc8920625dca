// herald-ingest: chat.events -> herald.ingested (keyed by conversation id); invalid events -> herald.dlq;
// open / super-group channels dropped (counted as `channel_type`). Configuration: docs/pipeline.md.
import Foundation
import HeraldConfig
import HeraldPipeline
import HeraldStage

let setup: StageSetup
do {
    setup = try await StageSetup.start(.ingest)
} catch {
    FileHandle.standardError.write(Data("herald-ingest: \(error)\n".utf8))
    exit(2)
}
let topics = setup.pipeline.kafka.topics
// The explain trail records ingest's drops; Redis is optional for ingest's own work, so it is not a readiness check.
let redis = try? setup.redis()
setup.context.readiness.remove("redis")
let processor = IngestProcessor(ingestedTopic: topics.ingested)
exit(await setup.run(processor: processor, topics: [topics.chatEvents], explain: redis.map { setup.explainSink($0) }))
