// herald-ingest: chat.events -> herald.ingested or herald.ingested.priority (by the event's priority class,
// keyed by conversation id); invalid events -> herald.dlq; open / super-group channels dropped (counted as
// `channel_type`). Configuration: docs/pipeline.md.
import Foundation
import HeraldConfig
import HeraldPipeline
import HeraldStage

let setup = await StageSetup.startOrExit(.ingest)
let topics = setup.pipeline.kafka.topics
// `HERALD_PRIORITY_LANES=off` puts every event on the bulk lane (the pipeline without lanes, for comparisons).
let lanesOff = setup.valueOrExit { config throws(ConfigurationError) in try config.text(.priorityLanes) } == "off"
if lanesOff { setup.logger.warning("\(ConfigKey.priorityLanes.name)=off: every event takes the bulk lane") }
// The event's priority class picks its lane: herald.ingested.priority (urgent, high) or herald.ingested.
var processor = IngestProcessor(
    ingestedTopic: topics.ingested, priorityTopic: lanesOff ? nil : topics.ingestedPriority,
    apps: setup.pipeline.apps)
// The apps (known ids, priority policies) are reloaded from the pipeline file on SIGHUP and when it changes.
let apps = LiveAppDirectory(setup.pipeline.apps)
processor.live = apps
let reloader = PipelineReloader.forStageOrExit(setup) { config in apps.replace(with: config.apps) }
StageProcess.exit(
    await setup.run(
        processor: processor, topics: [topics.chatEvents], explain: setup.bestEffortExplainSink(), before: [reloader]))
