// herald-ingest: chat.events -> herald.ingested (keyed by conversation id); invalid events -> herald.dlq;
// open / super-group channels dropped (counted as `channel_type`). Configuration: docs/pipeline.md.
import Foundation
import HeraldConfig
import HeraldPipeline
import HeraldStage

let setup = await StageSetup.startOrExit(.ingest)
let topics = setup.pipeline.kafka.topics
let processor = IngestProcessor(ingestedTopic: topics.ingested)
exit(await setup.run(processor: processor, topics: [topics.chatEvents], explain: setup.bestEffortExplainSink()))
