// herald-send: herald.outbound + herald.retry -> APNs and FCM over HTTP/2, custom webhooks over HTTPS/1.1;
// dead tokens -> herald.token-feedback,
// retryable failures -> herald.retry, permanent failures -> herald.dlq. Idempotency records in Redis.
import Foundation
import HeraldConfig
import HeraldCore
import HeraldPipeline
import HeraldRedis
import HeraldSend
import HeraldStage

// send's own keys (APNs, FCM and webhook connections, retries, in-flight bound) are declared with the others in
// HeraldStage's ConfigKeys.swift; a bad value ends the process at startup (status 2), naming the key.
let setup = await StageSetup.startOrExit(.send)
let redis = setup.redisOrExit()
func setting(_ key: ConfigKey) -> Int {
    setup.valueOrExit { config throws(ConfigurationError) in try config.requiredInt(key) }
}
func optionalText(_ key: ConfigKey) -> String? {
    setup.valueOrExit { config throws(ConfigurationError) in try config.text(key) }
}
func endpoint(_ key: ConfigKey) -> ServiceEndpoint? {
    guard let raw = optionalText(key) else { return nil }
    return setup.valueOrExit { _ throws(ConfigurationError) in
        guard let parsed = ServiceEndpoint(parsing: raw) else {
            throw ConfigurationError(key: key.name, value: raw, reason: "expected host[:port]")
        }
        return parsed
    }
}
let maxInFlight = setting(.sendMaxInFlight)
let timeoutMs = setting(.apnsTimeoutMs)
KeyFiles.warnAboutExposedKeys(setup.pipeline.apps, logger: setup.logger)
let transport = APNsPushTransport(
    apps: setup.pipeline.apps,
    settings: ProviderClientSettings(
        endpoint: endpoint(.apnsHost), caFile: optionalText(.apnsCAFile), connections: setting(.apnsConnections),
        maxInFlight: maxInFlight, priorityReserve: Double(setting(.sendPriorityReservePercent)) / 100,
        priorityConnections: setting(.apnsPriorityConnections), timeout: .milliseconds(timeoutMs)),
    environment: ProcessInfo.processInfo.environment, logger: setup.logger)
let fcmTransport = FCMPushTransport(
    apps: setup.pipeline.apps,
    settings: ProviderClientSettings(
        endpoint: endpoint(.fcmHost), caFile: optionalText(.fcmCAFile), connections: setting(.fcmConnections),
        maxInFlight: maxInFlight, priorityReserve: Double(setting(.sendPriorityReservePercent)) / 100,
        priorityConnections: setting(.fcmPriorityConnections), timeout: .milliseconds(timeoutMs)),
    logger: setup.logger)
let webhookTransport = WebhookPushTransport(
    apps: setup.pipeline.apps,
    caFile: optionalText(.webhookCAFile),
    maxInFlight: maxInFlight, environment: ProcessInfo.processInfo.environment,
    logger: setup.logger)
let webpushTransport = WebPushPushTransport(
    apps: setup.pipeline.apps, caFile: optionalText(.webpushCAFile), maxOrigins: setting(.webpushMaxOrigins),
    maxInFlight: maxInFlight, timeout: .milliseconds(timeoutMs), logger: setup.logger)
let liveApps = LiveAppDirectory(setup.pipeline.apps)
let router = RoutingPushTransport(
    apns: transport, fcm: fcmTransport, webhook: webhookTransport, webpush: webpushTransport)
// The rule is `SendReadiness`'s (an app on FCM, webhooks or Web Push only does not wait for an APNs connection).
setup.context.readiness.register("fcm") { router.readiness.fcm }
setup.context.readiness.register("apns") { router.readiness.apns }

let topics = setup.pipeline.kafka.topics
let logger = setup.logger
let metrics = setup.context.metrics
// The priority lane has a Redis connection of its own: its claims and confirmations never queue behind a bulk
// batch's.
let priorityRedis = setup.redisOrExit()
func store(_ lane: Lane) -> StateStore {
    StateStore(
        connection: lane == .priority ? priorityRedis : redis, logger: logger,
        deliveredShards: UInt64(setup.pipeline.idempotency.shards))
}
func sender(_ lane: Lane) -> SendProcessor {
    var processor = SendProcessor(
        retryTopic: topics.retry(lane), tokenFeedbackTopic: topics.tokenFeedback, transport: router,
        ledger: RedisDeliveryLedger(
            store: store(lane), windowMilliseconds: Int64(setup.pipeline.idempotency.replayWindowSeconds) * 1000),
        owner: "\(setup.context.environment.instance)-\(UUIDString.random())",
        // A claim outlives the longest a request can take (queueing for a stream, then its deadline).
        claimTTL: .milliseconds(2 * timeoutMs + 30_000),
        retryPolicy: BackoffPolicy(
            initialDelay: .milliseconds(setting(.sendRetryInitialMs)),
            maxDelay: .milliseconds(setting(.sendRetryMaxMs)),
            maxAttempts: setting(.sendMaxAttempts)),
        onTransientFailure: { failure in
            metrics.redisError(code: "transient")
            logger.warning("redis unavailable; retrying", metadata: ["error": "\(failure)"])
        })
    processor.prioritized = lane == .priority
    processor.onPhase = metrics.lane(lane.rawValue).sendPhaseRecorder()
    processor.apps = setup.pipeline.apps
    processor.live = liveApps
    return processor
}
// Batches run concurrently (order per device token does not matter to APNs; a batch holding a retry until its
// not_before must not block fresh notifications); at the in-flight bound the loop takes no more.
// One loop per lane, each with its own in-flight bound: the priority lane's records never wait behind bulk
// ones in Kafka or in the loop, and the APNs clients start them first (docs/pipeline.md, "Priority lanes").
let lanes = Lane.allCases.map { lane in
    StageLane(
        lane, topics: [topics.outbound(lane), topics.retry(lane)], processor: sender(lane),
        maxConcurrentBatches: 64, maxInFlight: maxInFlight)
}
// APNs and FCM credentials, webhooks and the list of apps are reloaded from the pipeline file on SIGHUP and when it
// changes; a credential that does not load or a webhook that does not resolve refuses the whole file.
let reloader = PipelineReloader.forStageOrExit(setup) { config in
    let fcm = try fcmTransport.prepare(apps: config.apps)
    let hooks: WebhookPushTransport.Endpoints
    let webpush: WebPushPushTransport.Prepared
    do {
        hooks = try webhookTransport.prepare(apps: config.apps)
        webpush = try webpushTransport.prepare(apps: config.apps)
        try transport.reload(apps: config.apps)
    } catch {
        Task { await fcm.discard() }
        throw error
    }
    fcmTransport.commit(fcm)
    webhookTransport.commit(hooks)
    webpushTransport.commit(webpush)
    liveApps.replace(with: config.apps)
}
StageProcess.exit(await setup.run(lanes: lanes, explain: setup.bestEffortExplainSink(), before: [router, reloader]))
