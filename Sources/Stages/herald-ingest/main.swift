// herald-ingest: chat.events -> herald.ingested or herald.ingested.priority (by the event's priority class,
// keyed by conversation id); invalid events -> herald.dlq; open / super-group channels dropped (counted as
// `channel_type`). Configuration: docs/pipeline.md.
import Foundation
import HeraldConfig
import HeraldPipeline
import HeraldStage

/// `HERALD_PRIORITY_LANES=off` puts every event on the bulk lane (the pipeline without lanes, for comparisons).
let lanesKey = "HERALD_PRIORITY_LANES"
let setup = await StageSetup.startOrExit(.ingest, extraKnownKeys: [lanesKey])
let topics = setup.pipeline.kafka.topics
let lanesOff = setup.environment(lanesKey)?.lowercased() == "off"
if lanesOff { setup.logger.warning("\(lanesKey)=off: every event takes the bulk lane") }
// The event's priority class picks its lane: herald.ingested.priority (urgent, high) or herald.ingested.
let processor = IngestProcessor(ingestedTopic: topics.ingested, priorityTopic: lanesOff ? nil : topics.ingestedPriority,
                                apps: setup.pipeline.apps)
exit(await setup.run(processor: processor, topics: [topics.chatEvents], explain: setup.bestEffortExplainSink()))
